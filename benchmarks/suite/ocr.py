"""PP-OCR inputs, pre/post-processing and metrics, without rapidocr, OpenCV or any download.

Inputs are rendered with Pillow in DejaVu Sans (the TrueType font matplotlib ships in
``mpl-data/fonts/ttf``; the system's DejaVu is the fallback):

* text lines: known strings (invoice/address/date/price style lines built from a seeded RNG), dark
  text on a light background at several font sizes, cropped to the text with a small margin, as a
  detector would crop them; for the direction classifier half of them are rotated by 180 degrees;
* documents: a light page (``H x W``, multiples of 32) with several such lines at random positions.

Processing follows rapidocr-onnxruntime 1.4.4 (``config.yaml`` in the wheel), simplified:

* det: BGR image, ``(x / 255 - 0.5) / 0.5``, NCHW, sides resized to multiples of 32; the output
  probability map thresholded at 0.3 (DB's ``thresh``) is the text mask (no box extraction);
* rec: height 48, width ``ceil(48 * w / h)``, normalised like det, right-padded with zeros to a common
  width; CTC greedy decoding (argmax, merge repeats, drop blank 0) over
  ``["blank"] + characters + [" "]``;
* cls: height 48, width ``min(192, ceil(48 * w / h))``, normalised, zero-padded to 192; labels 0/180.
"""
from __future__ import annotations

import math
import os
import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np

DET_THRESH = 0.3
REC_HEIGHT = 48
CLS_SHAPE = (3, 48, 192)

_WORDS = ("invoice order total amount paid due date account number customer address street road avenue "
          "city office phone email reference delivery shipping item quantity price tax balance payment "
          "receipt station platform north south east west central park river bridge market school library "
          "hospital airport hotel room floor building meeting report summary project budget review "
          "january february march april may june july august september october november december").split()
_NAMES = "Smith Johnson Miller Brown Davis Wilson Taylor Clark Lewis Walker Young Allen King Wright Scott".split()


def font_path() -> Path:
    """DejaVuSans.ttf from matplotlib's data (the ``bench`` extra), else a system copy."""
    try:
        import matplotlib

        p = Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf"
        if p.is_file():
            return p
    except ImportError:
        pass
    for p in (Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"), Path("/usr/share/fonts/TTF/DejaVuSans.ttf")):
        if p.is_file():
            return p
    raise FileNotFoundError("DejaVuSans.ttf not found: install the bench extra (matplotlib)")


def text_lines(n: int, seed: int = 0) -> list[str]:
    """``n`` deterministic, varied printed-document lines (letters, digits, punctuation)."""
    rng = random.Random(seed)
    w = lambda: rng.choice(_WORDS)  # noqa: E731
    templates = [
        lambda: f"{w().capitalize()} {w()} {rng.randint(10, 9999)}",
        lambda: f"Invoice No. {rng.randint(10000, 99999)}",
        lambda: f"Total: ${rng.randint(1, 9999)}.{rng.randint(0, 99):02d}",
        lambda: f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/{rng.randint(1990, 2030)}",
        lambda: f"{rng.randint(1, 999)} {rng.choice(_NAMES)} {rng.choice(['Street', 'Road', 'Avenue'])}",
        lambda: f"{w().capitalize()} {w()} {w()}",
        lambda: f"Mr. {rng.choice(_NAMES)}, {w()} {w()}",
        lambda: f"Tel. +{rng.randint(1, 99)} {rng.randint(100, 999)} {rng.randint(1000, 9999)}",
        lambda: f"{w().upper()} {rng.randint(1, 99)}%",
        lambda: f"{w().capitalize()} {w()}, {w()} and {w()}",
    ]
    return [templates[i % len(templates)]() for i in range(n)]


def _load_font(size: int):
    from PIL import ImageFont

    return ImageFont.truetype(str(font_path()), size)


def render_line(text: str, size: int, fg: int = 20, bg: int = 245, margin: float = 0.25) -> np.ndarray:
    """RGB uint8 ``[h, w, 3]`` image of ``text`` cropped to its ink with a margin of ``margin * size``."""
    from PIL import Image, ImageDraw

    font = _load_font(size)
    x0, y0, x1, y1 = font.getbbox(text)
    m = max(2, int(round(margin * size)))
    img = Image.new("RGB", (x1 - x0 + 2 * m, y1 - y0 + 2 * m), (bg, bg, bg))
    ImageDraw.Draw(img).text((m - x0, m - y0), text, font=font, fill=(fg, fg, fg))
    return np.asarray(img)


def line_images(n: int, seed: int = 0) -> tuple[list[np.ndarray], list[str]]:
    """``n`` rendered text lines (RGB uint8) and their ground-truth strings."""
    rng = random.Random(seed + 1)
    texts = text_lines(n, seed)
    imgs = []
    for t in texts:
        fg, bg = rng.randint(0, 70), rng.randint(200, 255)
        imgs.append(render_line(t, rng.choice((22, 26, 30, 34, 40)), fg=fg, bg=bg, margin=rng.uniform(0.12, 0.3)))
    return imgs, texts


def document(height: int, width: int, seed: int = 0, n_lines: int = 7) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """A page with ``n_lines`` lines of text: (RGB uint8 image, ground-truth ink-box mask, texts)."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    bg = rng.randint(215, 255)
    img = Image.new("RGB", (width, height), (bg, bg - rng.randint(0, 10), bg - rng.randint(0, 15)))
    draw = ImageDraw.Draw(img)
    mask = np.zeros((height, width), dtype=bool)
    texts = text_lines(n_lines, seed=seed + 1000)
    y = rng.randint(8, 30)
    for t in texts:
        size = rng.choice((18, 22, 26, 30, 36))
        font = _load_font(size)
        x0, y0, x1, y1 = font.getbbox(t)
        if y + (y1 - y0) + 8 > height:
            break
        x = rng.randint(10, max(11, width - (x1 - x0) - 10))
        fg = rng.randint(0, 80)
        draw.text((x - x0, y - y0), t, font=font, fill=(fg, fg, rng.randint(fg, 120)))
        mask[y:y + (y1 - y0), x:x + (x1 - x0)] = True
        y += (y1 - y0) + rng.randint(12, 45)
    return np.asarray(img), mask, texts


def _normalize(rgb: np.ndarray) -> np.ndarray:
    """RGB uint8 HWC -> BGR float32 CHW in [-1, 1] (PaddleOCR's mean = std = 0.5)."""
    x = rgb[..., ::-1].astype(np.float32) / 255.0
    return ((x - 0.5) / 0.5).transpose(2, 0, 1)


def _resize(rgb: np.ndarray, w: int, h: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(rgb).resize((w, h), Image.BILINEAR))


def det_input(rgb: np.ndarray, max_side: int = 960) -> np.ndarray:
    """``[1, 3, H, W]`` det input: longest side at most ``max_side``, both sides multiples of 32."""
    h, w = rgb.shape[:2]
    r = min(1.0, max_side / max(h, w))
    nh, nw = max(32, int(round(h * r / 32)) * 32), max(32, int(round(w * r / 32)) * 32)
    if (nh, nw) != (h, w):
        rgb = _resize(rgb, nw, nh)
    return _normalize(rgb)[None]


def det_mask(prob: np.ndarray, thresh: float = DET_THRESH) -> np.ndarray:
    """Binary text mask from the DB probability map (``[N, 1, H, W]`` or ``[H, W]``)."""
    return np.asarray(prob) > thresh


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two boolean masks (1.0 when both are empty)."""
    a, b = np.asarray(a, bool), np.asarray(b, bool)
    if a.shape != b.shape:
        raise ValueError(f"mask shapes differ: {a.shape} vs {b.shape}")
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


def rec_width(images: Sequence[np.ndarray], min_width: int = 320, height: int = REC_HEIGHT) -> int:
    """Common rec input width: ``height * max(w/h)``, at least ``min_width``, rounded up to a multiple of 8."""
    ratio = max([im.shape[1] / im.shape[0] for im in images] + [min_width / height])
    return int(math.ceil(height * ratio / 8) * 8)


def rec_input(images: Sequence[np.ndarray], width: int, height: int = REC_HEIGHT) -> np.ndarray:
    """``[N, 3, height, width]``: each line resized to ``height`` keeping its ratio, zero-padded on the right."""
    out = np.zeros((len(images), 3, height, width), dtype=np.float32)
    for i, im in enumerate(images):
        w = min(width, int(math.ceil(height * im.shape[1] / im.shape[0])))
        out[i, :, :, :w] = _normalize(_resize(im, w, height))
    return out


def cls_input(images: Sequence[np.ndarray], shape: tuple[int, int, int] = CLS_SHAPE) -> np.ndarray:
    """``[N, 3, 48, 192]`` direction-classifier input (rapidocr's ``resize_norm_img``)."""
    _, height, width = shape
    out = np.zeros((len(images),) + tuple(shape), dtype=np.float32)
    for i, im in enumerate(images):
        w = min(width, int(math.ceil(height * im.shape[1] / im.shape[0])))
        out[i, :, :, :w] = _normalize(_resize(im, w, height))
    return out


def load_characters(path: str | os.PathLike) -> list[str]:
    """CTC alphabet: ``["blank"] + keys-file characters + [" "]`` (PP-OCR's ``use_space_char``)."""
    keys = Path(path).read_text(encoding="utf-8").splitlines()
    return ["blank"] + keys + [" "]


def ctc_greedy_decode(probs: np.ndarray, characters: Sequence[str], blank: int = 0) -> list[str]:
    """Best-path CTC decoding of ``[N, T, C]`` scores: argmax per step, merge repeats, drop ``blank``."""
    idx = np.asarray(probs).argmax(-1)
    out = []
    for row in idx:
        keep = np.ones(len(row), dtype=bool)
        keep[1:] = row[1:] != row[:-1]
        keep &= row != blank
        out.append("".join(characters[int(i)] for i in row[keep]))
    return out


def edit_distance(a: Sequence, b: Sequence) -> int:
    """Levenshtein distance (insertions, deletions, substitutions all cost 1)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def cer(hyp: str, ref: str) -> float:
    """Character error rate of ``hyp`` against ``ref``: edit distance / len(ref) (0 or 1 when ``ref`` is empty)."""
    if not ref:
        return 0.0 if not hyp else 1.0
    return edit_distance(hyp, ref) / len(ref)


def rotate180(rgb: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rgb[::-1, ::-1])
