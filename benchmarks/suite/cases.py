"""The suite's models: real inputs, calibration/evaluation splits, and a quality metric against FP32.

Each :class:`Case` carries the model path, calibration and held-out evaluation feeds (disjoint), and
``score(fp32_outputs, quantized_outputs) -> {metric: value}`` over the evaluation feeds' outputs (one
list of output arrays per feed, in the model's output order). ``primary`` names the metric that
decides "sim >= baseline" and whether higher is better.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks.common import top1_agreement
from benchmarks.suite import ocr, text

Outputs = list[list[np.ndarray]]  # per feed, the model's outputs in order


@dataclass
class Size:
    """Split sizes (number of images / lines / sentences / files) and batch sizes."""

    det: tuple[int, int]
    rec: tuple[int, int]
    cls: tuple[int, int]
    minilm: tuple[int, int]
    magika: tuple[int, int]
    nudenet: tuple[int, int] = (16, 32)
    layout: tuple[int, int] = (6, 10)
    orientation: tuple[int, int] = (6, 16)
    ddddocr: tuple[int, int] = (24, 64)
    silero: tuple[int, int] = (8, 16)
    clip_seconds: float = 8.0
    line_batch: int = 8
    sentence_batch: int = 16
    file_batch: int = 64


FULL = Size(det=(8, 16), rec=(32, 96), cls=(32, 96), minilm=(64, 156), magika=(256, 512))
QUICK = Size(det=(2, 4), rec=(8, 24), cls=(8, 24), minilm=(16, 48), magika=(64, 128), nudenet=(4, 8),
             layout=(2, 3), orientation=(2, 4), ddddocr=(8, 16), silero=(3, 4), clip_seconds=4.0)

DOC_SHAPES = ((480, 640), (640, 480))  # documents alternate landscape / portrait


@dataclass
class Case:
    name: str
    model_path: Path
    calib: list[dict[str, np.ndarray]]
    eval: list[dict[str, np.ndarray]]
    score: Callable[[Outputs, Outputs], dict[str, float]]
    primary: str
    higher_is_better: bool
    data: str
    fp32_check: Callable[[Outputs], str] | None = None  # sanity of FP32 against ground truth


def _sizes_note(n_cal: int, n_eval: int, unit: str) -> str:
    return f"{n_cal}/{n_eval} {unit}"


# ----------------------------------------------------------------------------------------------- OCR
def det_case(model_dir: Path, size: Size) -> Case:
    n_cal, n_eval = size.det
    docs = [ocr.document(*DOC_SHAPES[i % 2], seed=i) for i in range(n_cal + n_eval)]
    feeds = [{"x": ocr.det_input(img)} for img, _, _ in docs]
    truth = [m for _, m, _ in docs[n_cal:]]

    def score(ref: Outputs, q: Outputs) -> dict[str, float]:
        ious = [ocr.mask_iou(ocr.det_mask(a[0]), ocr.det_mask(b[0])) for a, b in zip(ref, q)]
        return {"mask IoU mean": float(np.mean(ious)), "mask IoU min": float(np.min(ious))}

    def check(ref: Outputs) -> str:
        # DB shrinks text regions, so the FP32 mask covers only the middle of each line: report precision
        masks = [ocr.det_mask(a[0])[0, 0] for a in ref]
        inside = [float((m & t).sum() / max(m.sum(), 1)) for m, t in zip(masks, truth)]
        return f"FP32 text-mask pixels inside the rendered lines' ink boxes: {100 * np.mean(inside):.1f}%"

    return Case("PP-OCRv4 det", model_dir / "det.onnx", feeds[:n_cal], feeds[n_cal:], score,
                "mask IoU mean", True, _sizes_note(n_cal, n_eval, "rendered documents, 480x640 / 640x480"),
                check)


def _line_batches(images: Sequence[np.ndarray], batch: int) -> list[list[int]]:
    """Indices grouped like rapidocr does: sorted by aspect ratio, ``batch`` lines per group."""
    order = sorted(range(len(images)), key=lambda i: images[i].shape[1] / images[i].shape[0])
    return [order[i:i + batch] for i in range(0, len(order), batch)]


def rec_case(model_dir: Path, size: Size) -> Case:
    n_cal, n_eval = size.rec
    chars = ocr.load_characters(model_dir / "ppocr_keys.txt")
    imgs_c, _ = ocr.line_images(n_cal, seed=100)
    imgs_e, texts_e = ocr.line_images(n_eval, seed=200)

    def make(imgs):
        groups = _line_batches(imgs, size.line_batch)
        sub = [[imgs[i] for i in g] for g in groups]
        return [{"x": ocr.rec_input(s, ocr.rec_width(s))} for s in sub], [i for g in groups for i in g]

    cal, _ = make(imgs_c)
    ev, order = make(imgs_e)
    truth = [texts_e[i] for i in order]
    decode = lambda outs: [t for o in outs for t in ocr.ctc_greedy_decode(o[0], chars)]  # noqa: E731

    def score(ref: Outputs, q: Outputs) -> dict[str, float]:
        r, h = decode(ref), decode(q)
        return {"text = FP32": float(np.mean([a == b for a, b in zip(r, h)])),
                "CER vs FP32": float(np.mean([ocr.cer(b, a) for a, b in zip(r, h)])),
                "CER vs truth": float(np.mean([ocr.cer(b.strip(), t) for b, t in zip(h, truth)]))}

    def check(ref: Outputs) -> str:
        r = decode(ref)
        return (f"FP32 vs ground truth: {100 * np.mean([a.strip() == t for a, t in zip(r, truth)]):.1f}% lines exact, "
                f"CER {100 * np.mean([ocr.cer(a.strip(), t) for a, t in zip(r, truth)]):.2f}%")

    return Case("PP-OCRv4 rec", model_dir / "rec.onnx", cal, ev, score, "CER vs FP32", False,
                _sizes_note(n_cal, n_eval, "rendered text lines"), check)


def cls_case(model_dir: Path, size: Size) -> Case:
    n_cal, n_eval = size.cls

    def make(n, seed):
        imgs, _ = ocr.line_images(n, seed=seed)
        imgs = [ocr.rotate180(im) if i % 2 else im for i, im in enumerate(imgs)]
        labels = np.arange(n) % 2
        b = size.line_batch
        return [{"x": ocr.cls_input(imgs[i:i + b])} for i in range(0, n, b)], labels

    cal, _ = make(n_cal, 300)
    ev, labels = make(n_eval, 400)

    def score(ref: Outputs, q: Outputs) -> dict[str, float]:
        a, b = np.concatenate([o[0] for o in ref]), np.concatenate([o[0] for o in q])
        return {"top-1 = FP32": top1_agreement(a, b), "accuracy": float(np.mean(b.argmax(-1) == labels))}

    def check(ref: Outputs) -> str:
        a = np.concatenate([o[0] for o in ref])
        return f"FP32 accuracy on 0/180 degrees: {100 * np.mean(a.argmax(-1) == labels):.1f}%"

    return Case("PP-OCR mobile cls", model_dir / "cls.onnx", cal, ev, score, "top-1 = FP32", True,
                _sizes_note(n_cal, n_eval, "text lines, half rotated 180"), check)


# -------------------------------------------------------------------------------------------- MiniLM
def _model_io(model_path: Path) -> tuple[list[str], list[str]]:
    import onnx

    m = onnx.load(str(model_path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    return [i.name for i in m.graph.input if i.name not in inits], [o.name for o in m.graph.output]


def _token_output(model_path: Path) -> int:
    """Index of the ``[batch, seq, hidden]`` float output (the token embeddings)."""
    import onnx

    m = onnx.load(str(model_path), load_external_data=False)
    for k, o in enumerate(m.graph.output):
        t = o.type.tensor_type
        if t.elem_type == onnx.TensorProto.FLOAT and len(t.shape.dim) == 3:
            return k
    raise RuntimeError(f"{model_path} has no rank-3 float output")


def minilm_case(model_dir: Path, size: Size) -> Case:
    n_cal, n_eval = size.minilm
    sentences = text.load_sentences()
    if len(sentences) < n_cal + n_eval:
        raise ValueError(f"need {n_cal + n_eval} sentences, the data file has {len(sentences)}")
    path = model_dir / "model.onnx"
    inputs, _ = _model_io(path)
    tok_out = _token_output(path)
    tok = text.WordPieceTokenizer.from_dir(model_dir)
    # calibration sentences are spread evenly over the file (which groups them by stdlib module)
    cal_i = set(np.round(np.linspace(0, len(sentences) - 1, n_cal)).astype(int).tolist())
    cal_s = [s for i, s in enumerate(sentences) if i in cal_i]
    ev_s = [s for i, s in enumerate(sentences) if i not in cal_i][:n_eval]
    cal = text.feeds(tok, cal_s, size.sentence_batch, inputs)
    ev = text.feeds(tok, ev_s, size.sentence_batch, inputs)
    masks = [f["attention_mask"] for f in ev]

    def embed(outs: Outputs) -> np.ndarray:
        return np.concatenate([text.mean_pool(o[tok_out], m) for o, m in zip(outs, masks)])

    def score(ref: Outputs, q: Outputs) -> dict[str, float]:
        c = text.cosine(embed(ref), embed(q))
        return {"cosine mean": float(c.mean()), "cosine min": float(c.min())}

    return Case("paraphrase-MiniLM-L3-v2", path, cal, ev, score, "cosine mean", True,
                _sizes_note(len(cal_s), len(ev_s), "stdlib-docstring sentences"))


# -------------------------------------------------------------------------------------------- magika
def magika_case(model_dir: Path, size: Size) -> Case:
    from benchmarks import magika_inputs as mi

    n_cal, n_eval = size.magika
    paths = mi.find_real_files(n_cal + n_eval, seed=7)
    feats = mi.features(paths, model_dir)
    name = mi.input_name(model_dir)
    # interleave so both splits cover every file type (find_real_files goes round-robin over extensions)
    idx = np.arange(len(paths))
    step = max(1, round(len(paths) / max(n_cal, 1)))
    cal_idx = idx[::step][:n_cal]
    ev_idx = np.setdiff1d(idx, cal_idx)
    cal = mi.batches(feats[cal_idx], size.file_batch, name)
    ev = mi.batches(feats[ev_idx], size.file_batch, name)
    labels = mi.labels(model_dir)
    ev_paths = [paths[i] for i in ev_idx]

    def score(ref: Outputs, q: Outputs) -> dict[str, float]:
        a, b = np.concatenate([o[0] for o in ref]), np.concatenate([o[0] for o in q])
        return {"top-1 = FP32": top1_agreement(a, b)}

    def check(ref: Outputs) -> str:
        a = np.concatenate([o[0] for o in ref]).argmax(-1)
        ok = [mi.expected_ok(p, labels[i]) for p, i in zip(ev_paths, a)]
        ok = [o for o in ok if o is not None]
        return f"FP32 label fits the file extension: {100 * np.mean(ok):.1f}% of {len(ok)} files"

    return Case("magika", model_dir / "model.onnx", cal, ev, score, "top-1 = FP32", True,
                _sizes_note(len(cal_idx), len(ev_idx), "real files on this machine"), check)


BUILDERS = {"det": ("ppocr", det_case), "rec": ("ppocr", rec_case), "cls": ("ppocr", cls_case),
            "minilm": ("minilm", minilm_case), "magika": ("magika", magika_case)}
