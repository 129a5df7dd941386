"""Detector post-processing and the detection metric of the wider suite (numpy only, no OpenCV).

* :func:`yolov8_boxes`: Ultralytics YOLOv8 head output ``[4 + classes, anchors]`` (``cx, cy, w, h`` in
  input pixels, then per-class sigmoid scores) -> per-class NMS'd boxes, as nudenet 3.4.2 decodes it;
* :func:`picodet_boxes`: PP-PicoDet outputs (per stride 8/16/32/64: ``[1, A, classes]`` scores and
  ``[1, A, 4 * (reg_max + 1)]`` distance distributions) -> boxes, as rapid-layout 1.2.1 decodes them
  (softmax over the bins, expectation times stride, distances from cell centres, per-class hard NMS);
* :func:`detection_f1`: boxes matched greedily (highest IoU first, same class, IoU >= 0.5) against
  the FP32 model's boxes on the same image, summed over images: ``F1 = 2 TP / (n_ref + n_hyp)``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass
class Boxes:
    """Detections of one image: ``xyxy [n, 4]``, ``scores [n]``, ``classes [n]``."""

    xyxy: np.ndarray
    scores: np.ndarray
    classes: np.ndarray

    def __len__(self) -> int:
        return len(self.scores)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[len(a), len(b)]`` intersection over union of two sets of ``x1, y1, x2, y2`` boxes."""
    a, b = np.asarray(a, np.float64).reshape(-1, 4), np.asarray(b, np.float64).reshape(-1, 4)
    lt = np.maximum(a[:, None, :2], b[None, :, :2])
    rb = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(rb - lt, 0, None), axis=-1)
    area = lambda x: np.prod(np.clip(x[:, 2:] - x[:, :2], 0, None), axis=-1)  # noqa: E731
    union = area(a)[:, None] + area(b)[None, :] - inter
    return np.where(union > 0, inter / np.where(union > 0, union, 1), 0.0)


def nms(xyxy: np.ndarray, scores: np.ndarray, iou: float, top_k: int = 0) -> np.ndarray:
    """Indices kept by greedy hard non-maximum suppression, highest score first."""
    order = np.argsort(-np.asarray(scores), kind="stable")
    keep: list[int] = []
    while order.size:
        i = int(order[0])
        keep.append(i)
        if top_k and len(keep) == top_k:
            break
        rest = order[1:]
        order = rest[box_iou(xyxy[i:i + 1], xyxy[rest])[0] <= iou]
    return np.asarray(keep, dtype=np.int64)


def _per_class_nms(xyxy: np.ndarray, scores: np.ndarray, classes: np.ndarray, iou: float) -> Boxes:
    keep = [idx[nms(xyxy[idx], scores[idx], iou)] for c in np.unique(classes) for idx in [np.flatnonzero(classes == c)]]
    k = np.concatenate(keep) if keep else np.zeros(0, np.int64)
    return Boxes(xyxy[k].reshape(-1, 4), scores[k], classes[k])


def yolov8_boxes(out: np.ndarray, conf: float = 0.25, iou: float = 0.45) -> Boxes:
    """Boxes from one image's YOLOv8 head output ``[4 + classes, anchors]`` (best class per anchor)."""
    out = np.asarray(out, np.float64)
    cls_scores = out[4:].T
    classes, scores = cls_scores.argmax(1), cls_scores.max(1)
    sel = scores >= conf
    cx, cy, w, h = out[:4, sel]
    xyxy = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], axis=1)
    return _per_class_nms(xyxy, scores[sel], classes[sel], iou)


def _softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def picodet_boxes(scores: Sequence[np.ndarray], dists: Sequence[np.ndarray], input_hw: tuple[int, int],
                  strides: Sequence[int] = (8, 16, 32, 64), conf: float = 0.5, iou: float = 0.5) -> Boxes:
    """Boxes from one image's PicoDet outputs: per level ``[A, classes]`` scores and ``[A, 4 * bins]`` logits."""
    all_xyxy, all_scores = [], []
    for stride, sc, d in zip(strides, scores, dists):
        fh, fw = int(np.ceil(input_hw[0] / stride)), int(np.ceil(input_hw[1] / stride))
        yy, xx = np.meshgrid(np.arange(fh), np.arange(fw), indexing="ij")
        cx, cy = (xx.ravel() + 0.5) * stride, (yy.ravel() + 0.5) * stride
        bins = d.shape[-1] // 4
        dist = (_softmax(np.asarray(d, np.float64).reshape(-1, bins)) @ np.arange(bins)).reshape(-1, 4) * stride
        centre = np.stack([cx, cy, cx, cy], axis=1)
        all_xyxy.append(centre + np.array([-1, -1, 1, 1]) * dist)
        all_scores.append(np.asarray(sc, np.float64))
    xyxy, sc = np.concatenate(all_xyxy), np.concatenate(all_scores)
    rows, classes = np.nonzero(sc > conf)  # every class above the threshold, as rapid-layout does
    return _per_class_nms(xyxy[rows], sc[rows, classes], classes, iou)


def match_count(ref: Boxes, hyp: Boxes, iou: float = 0.5) -> int:
    """True positives: one-to-one same-class pairs with IoU >= ``iou``, taken greedily by IoU."""
    if not len(ref) or not len(hyp):
        return 0
    m = box_iou(ref.xyxy, hyp.xyxy)
    m[ref.classes[:, None] != hyp.classes[None, :]] = 0.0
    tp = 0
    while True:
        i, j = np.unravel_index(np.argmax(m), m.shape)
        if m[i, j] < iou:
            return tp
        tp += 1
        m[i, :] = 0.0
        m[:, j] = 0.0


def detection_f1(ref: Sequence[Boxes], hyp: Sequence[Boxes], iou: float = 0.5) -> float:
    """F1 of ``hyp`` against ``ref`` boxes over all images (1.0 when neither has a box)."""
    tp = sum(match_count(r, h, iou) for r, h in zip(ref, hyp))
    n = sum(len(r) for r in ref) + sum(len(h) for h in hyp)
    return 1.0 if n == 0 else 2.0 * tp / n
