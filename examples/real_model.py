"""The examples' default real model, self-contained: PP-OCR's text-direction classifier and text lines.

The model is ``ch_ppocr_mobile_v2.0_cls_infer.onnx`` from the ``rapidocr-onnxruntime`` wheel on PyPI
(Apache-2.0).  It is taken from quantsim's model cache when ``make bench`` already put it there, else
pip downloads the wheel once (``pip download --no-deps``; no model hub) and the one file is unpacked into
that cache.  The data are printed text lines rendered with Pillow's built-in font, every second one
turned upside down: the classifier's task is telling 0 from 180 degrees.  Needs Pillow (``pip install
Pillow`` or the ``bench`` extra); your own model and data need neither (``--model``/``--data``).
"""
from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

WHEEL = ("rapidocr-onnxruntime", "1.4.4")
MEMBER = "ch_ppocr_mobile_v2.0_cls_infer.onnx"
INPUT_SHAPE = (3, 48, 192)  # channels, height, width the classifier takes
_WORDS = ("invoice total amount paid date street order number account balance customer address phone "
          "delivery receipt tax price quantity item reference payment due bank transfer office city").split()


def model_cache() -> Path:
    """``$QUANTSIM_CACHE_DIR/models/ppocr`` (default ``~/.cache/quantsim``): where ``make bench`` puts PP-OCR."""
    root = Path(os.environ.get("QUANTSIM_CACHE_DIR") or Path.home() / ".cache" / "quantsim").expanduser()
    return root / "models" / "ppocr"


def classifier_path() -> Path:
    """PP-OCR mobile cls, from the cache or unpacked from the pip-downloaded wheel (written atomically)."""
    target = model_cache() / "cls.onnx"
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        name, version = WHEEL
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q",
                        "--disable-pip-version-check", f"{name}=={version}", "-d", tmp], check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            (member,) = [m for m in archive.namelist() if m.endswith(MEMBER)]
            staged = target.with_name(f".{target.name}.{os.getpid()}")
            staged.write_bytes(archive.read(member))
    os.replace(staged, target)
    return target


def _line(rng: random.Random) -> str:
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
    return f"{words.capitalize()} {rng.randint(1, 99999)}" if rng.random() < 0.6 else words.upper()


def text_line_batches(count: int, batch_size: int, seed: int = 0) -> tuple[list[dict[str, np.ndarray]], np.ndarray]:
    """``count`` rendered text lines as ``{"x": [N, 3, 48, 192]}`` feeds (the classifier's own normalisation)
    and their labels (0 upright, 1 upside down)."""
    from PIL import Image, ImageDraw, ImageFont

    rng = random.Random(seed)
    channels, height, width = INPUT_SHAPE
    rows = np.zeros((count, channels, height, width), np.float32)
    for i in range(count):
        text, size = _line(rng), rng.randint(20, 36)
        font = ImageFont.load_default(size=size)
        x0, y0, x1, y1 = font.getbbox(text)
        ink, paper = rng.randint(0, 60), rng.randint(200, 255)
        image = Image.new("L", (x1 - x0 + size // 2, y1 - y0 + size // 2), paper)
        ImageDraw.Draw(image).text((size // 4 - x0, size // 4 - y0), text, font=font, fill=ink)
        if i % 2:
            image = image.rotate(180)
        resized_width = min(width, max(1, round(height * image.width / image.height)))
        pixels = np.asarray(image.resize((resized_width, height)), np.float32) / 255.0
        rows[i, :, :, :resized_width] = (pixels - 0.5) / 0.5
    feeds = [{"x": rows[i:i + batch_size]} for i in range(0, count, batch_size)]
    return feeds, np.arange(count) % 2
