"""What one layer's optimisation reads, gathered in one streamed pass over the calibration data.

Two forms (see `adaround.linear_form` for the column layout):

* `SecondMoments` (no activation follows): the reconstruction loss
  ``sum over columns ||W_s c_q - W c_f||^2 / P`` is quadratic in ``W_s``, so it needs only
  ``S_qq = sum c_q c_q^T`` and ``S_qf = sum c_q c_f^T`` (``K x K`` per group, accumulated in float64) and
  ``W S_ff W^T``'s trace. Every iteration then sees all the data at ``O(M K^2)`` cost. For long columns
  (``K`` several times a mini-batch, e.g. a 768-wide Gemm) it can also keep ``sample``, a random subset
  of the sim-side columns in random order: `adaround.layer_rounding` then takes the exact gradient only
  at an anchor weight every few steps and corrects it on a window of the sample in between.
* `ColumnSample` (an activation follows): a uniform random subset of the columns of the sim's layer input
  and the float model's activation output, bounded by a memory budget, in data order; each iteration
  reads a window of consecutive columns at a random offset (neighbouring positions of a few samples,
  as AIMET's mini-batches of whole samples), a view that copies nothing.

The layer input comes from the sim (earlier layers already rounded, activations quantized as
configured); the target from the float model, through capturers made before any weight changed.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np

from adaround.linear_form import LinearForm
from quantsim import InvalidArgumentError

__all__ = ["SecondMoments", "ColumnSample", "second_moments", "column_sample", "output_columns"]


@dataclass
class SecondMoments:
    """Sufficient statistics of the quadratic reconstruction loss of one layer."""

    s_qq: np.ndarray  # [groups, K, K], float64 (losses nearly cancel: they are evaluated in float64)
    s_qf: np.ndarray  # [groups, K, K]
    s_ff: np.ndarray  # [groups, K, K]
    columns: int
    sample: np.ndarray | None = None  # [groups, K, S] sim-side columns in random order, or None

    def _float32(self) -> tuple[np.ndarray, np.ndarray]:
        """``S_qq`` and ``S_qf^T`` in float32, made on first use (Sequential MSE never takes a gradient): the
        gradient runs every iteration, and float32 is twice as fast and ample for it."""
        if getattr(self, "_qq32", None) is None:
            self._qq32 = self.s_qq.astype(np.float32)
            self._fq32 = np.ascontiguousarray(np.swapaxes(self.s_qf, 1, 2), dtype=np.float32)
        return self._qq32, self._fq32

    def loss(self, w_soft: np.ndarray, w_float: np.ndarray) -> float:
        """Mean over columns of the squared output error (summed over output channels)."""
        w_soft, w_float = w_soft.astype(np.float64), w_float.astype(np.float64)
        quad = np.einsum("gmk,gkl,gml->", w_soft, self.s_qq, w_soft, optimize=True)
        cross = np.einsum("gmk,gkl,gml->", w_soft, self.s_qf, w_float, optimize=True)
        const = np.einsum("gmk,gkl,gml->", w_float, self.s_ff, w_float, optimize=True)
        return float(quad - 2 * cross + const) / self.columns

    def grad(self, w_soft: np.ndarray, w_float: np.ndarray) -> np.ndarray:
        """``d loss / d W_soft`` (``[groups, M/g, K]``); the float weight's term is computed once per weight."""
        qq32, fq32 = self._float32()
        key = (w_float.ctypes.data, w_float.shape)
        if getattr(self, "_target_key", None) != key:
            self._target = np.matmul(w_float.astype(np.float32), fq32)
            self._target_key = key
        return (2.0 / self.columns) * (np.matmul(w_soft, qq32) - self._target)


@dataclass
class ColumnSample:
    """Sampled columns of the sim's layer input and the float model's target, in column form."""

    cols: np.ndarray  # [groups, K, P]
    target: np.ndarray  # [M, P]


def output_columns(form: LinearForm, y: np.ndarray) -> np.ndarray:
    """A layer output (or its activation's) in column form ``[M, P]``, columns ordered as `LinearForm.columns`."""
    if form.op_type in ("Conv", "ConvTranspose"):
        return np.moveaxis(y, 1, 0).reshape(y.shape[1], -1)
    return y.reshape(-1, y.shape[-1]).T


def second_moments(form: LinearForm, quantized: Iterator[Mapping[str, np.ndarray]],
                   floating: Iterator[Mapping[str, np.ndarray]] | None, tensor: str, *, sample_bytes: int = 0,
                   num_batches: int = 1, rng: np.random.Generator | None = None) -> SecondMoments:
    """Accumulate the moments of the sim's and the float model's inputs of one layer, batch by batch
    (``floating=None``: both sides read ``quantized``, all three moments are equal). ``sample_bytes > 0``:
    also keep a uniform random share of each of the ``num_batches`` batches' sim-side columns, at most
    that many bytes, shuffled (`SecondMoments.sample`)."""
    s_qq = s_qf = s_ff = None
    count = 0
    kept: list[np.ndarray] = []
    rng = np.random.default_rng(0) if rng is None else rng
    pairs = zip(quantized, floating) if floating is not None else ((batch, None) for batch in quantized)
    for q_batch, f_batch in pairs:
        cq, _ = form.columns(q_batch[tensor])
        cq64 = cq.astype(np.float64)
        qq = np.matmul(cq64, np.swapaxes(cq64, 1, 2))
        if f_batch is None:
            qf = ff = qq
        else:
            cf64 = form.columns(f_batch[tensor])[0].astype(np.float64)
            qf = np.matmul(cq64, np.swapaxes(cf64, 1, 2))
            ff = np.matmul(cf64, np.swapaxes(cf64, 1, 2))
        if f_batch is None:  # one sum for the three (the same numbers; `row_errors` then forms one product)
            s_qq = s_qf = s_ff = qq if s_qq is None else s_qq + qq
        else:
            s_qq, s_qf, s_ff = (qq, qf, ff) if s_qq is None else (s_qq + qq, s_qf + qf, s_ff + ff)
        count += cq.shape[2]
        if sample_bytes > 0:
            per_batch = max(1, sample_bytes // (4 * cq.shape[0] * cq.shape[1] * max(num_batches, 1)))
            kept.append(cq[:, :, np.sort(rng.choice(cq.shape[2], per_batch, replace=False))]
                        if cq.shape[2] > per_batch else cq)
    if s_qq is None or s_qf is None or s_ff is None or count == 0:
        raise InvalidArgumentError("the calibration data is empty: no batch reached the layer")
    sample = None
    if kept:
        joined = np.concatenate(kept, axis=2)
        sample = np.ascontiguousarray(joined[:, :, rng.permutation(joined.shape[2])])
    return SecondMoments(s_qq, s_qf, s_ff, count, sample)


def column_sample(form: LinearForm, quantized: Iterator[Mapping[str, np.ndarray]],
                  floating: Iterator[Mapping[str, np.ndarray]], input_tensor: str, target_tensor: str, *,
                  num_batches: int, memory_budget_bytes: int, rng: np.random.Generator) -> ColumnSample:
    """Keep a uniform random share of each batch's columns so that the sample fits the budget."""
    kept_cols, kept_target = [], []
    per_batch: int | None = None
    for q_batch, f_batch in zip(quantized, floating):
        cols, _ = form.columns(q_batch[input_tensor])
        target = output_columns(form, np.asarray(f_batch[target_tensor], dtype=np.float32))
        if per_batch is None:
            bytes_per_column = 4 * (cols.shape[0] * cols.shape[1] + target.shape[0])
            per_batch = max(1, memory_budget_bytes // (bytes_per_column * max(num_batches, 1)))
        if cols.shape[2] > per_batch:
            keep = np.sort(rng.choice(cols.shape[2], per_batch, replace=False))
            cols, target = cols[:, :, keep], target[:, keep]
        kept_cols.append(cols)
        kept_target.append(target)
    if not kept_cols:
        raise InvalidArgumentError("the calibration data is empty: no batch reached the layer")
    return ColumnSample(np.concatenate(kept_cols, axis=2), np.concatenate(kept_target, axis=1))
