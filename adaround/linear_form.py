"""Every weighted layer as ``out = W_mat @ cols + b``: the form AdaRound and Sequential MSE optimise in.

PURE numpy. A column is everything one output position reads:

* Conv (1-D, 2-D; any stride, dilation, padding, groups): ``cols`` is the im2col matrix per group,
  ``[groups, C/g * prod(kernel), positions]``; ``W_mat`` is the weight reshaped to ``[groups, M/g, K]``.
* ConvTranspose: the equivalent Conv over the input dilated by the stride (zeros between samples),
  padded by ``dilation * (k - 1) - pad`` (plus ``output_padding`` at the end), with the weight's
  in/out axes swapped per group and its kernel flipped; `to_weight` maps ``W_mat`` back exactly.
* Gemm (transA, transB, alpha): ``cols = alpha * A^T`` (``[1, K, N]``), ``W_mat = B^T`` or ``B``.
* MatMul with a constant 2-D weight ``[K, M]``: the input's rows are the columns, ``W_mat = W^T``.

Output columns are independent given ``W``: an output element depends on its own column only. So a
random subset of columns is an unbiased sample of the layer's reconstruction loss, and a Softmax over the
channel axis stays inside a column. `LinearForm.outputs` reshapes ``W_mat @ cols`` back to the layer's
output layout, which tests compare with onnxruntime.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

__all__ = ["LinearForm", "linear_form", "UnsupportedLayer"]


class UnsupportedLayer(Exception):
    """The layer has a configuration the linear form does not cover (the message says which)."""


def _pads(attrs: dict[str, Any], spatial: int, kernel: tuple[int, ...], strides, dilations, in_shape) -> list[int]:
    auto_pad = attrs.get("auto_pad", "NOTSET")
    if isinstance(auto_pad, bytes):
        auto_pad = auto_pad.decode()
    if auto_pad in ("NOTSET", ""):
        return list(attrs.get("pads", [0] * (2 * spatial)))
    if auto_pad == "VALID":
        return [0] * (2 * spatial)
    begin, end = [], []
    for size, k, s, d in zip(in_shape, kernel, strides, dilations):
        out = -(-size // s)
        total = max(0, (out - 1) * s + (k - 1) * d + 1 - size)
        small, large = total // 2, total - total // 2
        begin.append(large if auto_pad == "SAME_LOWER" else small)
        end.append(small if auto_pad == "SAME_LOWER" else large)
    return begin + end


def _im2col(x: np.ndarray, kernel, strides, dilations, pads, groups: int) -> tuple[np.ndarray, tuple[int, ...]]:
    """``[groups, C/g * prod(kernel), N * prod(out)]`` columns of ``x`` (N, C, *spatial) and the output
    spatial shape."""
    spatial = len(kernel)
    padding = [(0, 0), (0, 0)] + [(pads[i], pads[i + spatial]) for i in range(spatial)]
    x = np.pad(x, padding)
    window = tuple((k - 1) * d + 1 for k, d in zip(kernel, dilations))
    views = sliding_window_view(x, window, axis=tuple(range(2, 2 + spatial)))
    index = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)
    index += tuple(slice(None, None, d) for d in dilations)
    views = views[index]  # [N, C, *out, *kernel]
    n, c = x.shape[:2]
    out = views.shape[2:2 + spatial]
    # -> [groups, C/g, *kernel, N, *out] -> [groups, K, N * prod(out)]
    order = (1,) + tuple(range(2 + spatial, 2 + 2 * spatial)) + (0,) + tuple(range(2, 2 + spatial))
    cols = views.transpose(order).reshape(groups, (c // groups) * int(np.prod(kernel)), -1)
    return np.ascontiguousarray(cols, dtype=np.float32), tuple(out)


@dataclass(frozen=True)
class LinearForm:
    """How one layer maps to ``W_mat @ cols``: weight layout maps both ways, columns from inputs."""

    op_type: str
    attributes: dict[str, Any]
    weight_shape: tuple[int, ...]

    # weight <-> W_mat ----------------------------------------------------------------------------
    @property
    def groups(self) -> int:
        return int(self.attributes.get("group", 1)) if self.op_type in ("Conv", "ConvTranspose") else 1

    @property
    def rows(self) -> int:
        """``M``: the layer's output channels (rows of ``W_mat`` over all groups)."""
        shape = self.weight_shape
        if self.op_type == "Conv":
            return shape[0]
        if self.op_type == "ConvTranspose":
            return shape[1] * self.groups
        if self.op_type == "Gemm":
            return shape[0] if self.attributes.get("transB", 0) else shape[1]
        return shape[1]

    def to_matrix(self, weight: np.ndarray) -> np.ndarray:
        """``[groups, M/g, K]`` view (or copy) of a weight of `weight_shape`."""
        g = self.groups
        if self.op_type == "Conv":
            return weight.reshape(g, weight.shape[0] // g, -1)
        if self.op_type == "ConvTranspose":  # W[C, M/g, *k] -> per group [M/g, C/g, *flipped k]
            c, m_g = weight.shape[:2]
            spatial = tuple(range(2, weight.ndim))
            flipped = np.flip(weight, axis=spatial).reshape((g, c // g, m_g) + weight.shape[2:])
            return np.swapaxes(flipped, 1, 2).reshape(g, m_g, -1)
        if self.op_type == "Gemm":
            return (weight if self.attributes.get("transB", 0) else weight.T)[None]
        return weight.T[None]  # MatMul [K, M]

    def to_weight(self, matrix: np.ndarray) -> np.ndarray:
        """Inverse of `to_matrix` (also maps gradients with respect to ``W_mat`` back to the weight)."""
        g = self.groups
        shape = self.weight_shape
        if self.op_type == "Conv":
            return matrix.reshape(shape)
        if self.op_type == "ConvTranspose":
            c, m_g = shape[:2]
            per_group = matrix.reshape((g, m_g, c // g) + shape[2:])
            unflipped = np.swapaxes(per_group, 1, 2).reshape(shape)
            return np.flip(unflipped, axis=tuple(range(2, len(shape))))
        if self.op_type == "Gemm":
            return matrix[0] if self.attributes.get("transB", 0) else matrix[0].T
        return matrix[0].T

    # inputs -> columns -------------------------------------------------------------------------
    def columns(self, x: np.ndarray) -> tuple[np.ndarray, tuple[int, ...]]:
        """``(cols [groups, K, P], layout)`` for input ``x``; ``layout`` is what `outputs` needs."""
        x = np.asarray(x, dtype=np.float32)
        a = self.attributes
        if self.op_type in ("Conv", "ConvTranspose"):
            spatial = x.ndim - 2
            if spatial not in (1, 2):
                raise UnsupportedLayer(f"{self.op_type} with {spatial} spatial dimensions")
            kernel = tuple(self.weight_shape[2:])
            strides = tuple(a.get("strides", [1] * spatial))
            dilations = tuple(a.get("dilations", [1] * spatial))
            if self.op_type == "Conv":
                pads = _pads(a, spatial, kernel, strides, dilations, x.shape[2:])
                cols, out = _im2col(x, kernel, strides, dilations, pads, self.groups)
                return cols, (x.shape[0],) + out
            return self._transpose_columns(x, kernel, strides, dilations)
        if self.op_type == "Gemm":
            rows = x.T if a.get("transA", 0) else x
            return (float(a.get("alpha", 1.0)) * rows).T[None].astype(np.float32), (rows.shape[0],)
        if len(self.weight_shape) != 2:
            raise UnsupportedLayer(f"MatMul with a weight of rank {len(self.weight_shape)}")
        return x.reshape(-1, x.shape[-1]).T[None], x.shape[:-1]

    def _transpose_columns(self, x, kernel, strides, dilations):
        a, spatial = self.attributes, len(kernel)
        if a.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET", ""):
            raise UnsupportedLayer("ConvTranspose with auto_pad")
        if "output_shape" in a:
            raise UnsupportedLayer("ConvTranspose with output_shape")
        pads = list(a.get("pads", [0] * (2 * spatial)))
        extra = list(a.get("output_padding", [0] * spatial))
        n, c = x.shape[:2]
        dilated_shape = [(size - 1) * s + 1 for size, s in zip(x.shape[2:], strides)]
        dilated = np.zeros((n, c, *dilated_shape), dtype=np.float32)
        dilated[(slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides)] = x
        conv_pads = [d * (k - 1) - p for k, d, p in zip(kernel, dilations, pads[:spatial])]
        conv_pads += [d * (k - 1) - p + e for k, d, p, e in zip(kernel, dilations, pads[spatial:], extra)]
        if min(conv_pads) < 0:
            raise UnsupportedLayer("ConvTranspose with pads larger than its kernel")
        cols, out = _im2col(dilated, kernel, (1,) * spatial, dilations, conv_pads, self.groups)
        return cols, (n,) + out

    def outputs(self, product: np.ndarray, layout: tuple[int, ...]) -> np.ndarray:
        """Reshape ``W_mat @ cols`` (``[groups, M/g, P]``) to the layer's output layout (bias not added)."""
        g, m_g, _ = product.shape
        if self.op_type in ("Conv", "ConvTranspose"):
            n, out = layout[0], layout[1:]
            y = product.reshape(g * m_g, n, *out)
            return np.moveaxis(y, 0, 1)
        return product[0].T.reshape(*layout, m_g)

    def bias_matrix(self, bias: np.ndarray | None, rows: int) -> np.ndarray:
        """The bias as ``[groups, M/g, 1]`` (Gemm's ``beta`` applied), zeros without one."""
        g = self.groups
        if bias is None:
            return np.zeros((g, rows // g, 1), dtype=np.float32)
        values = np.asarray(bias, dtype=np.float32)
        if self.op_type == "Gemm":
            values = float(self.attributes.get("beta", 1.0)) * values
            if values.size not in (1, rows):
                raise UnsupportedLayer(f"Gemm bias of shape {values.shape} (per-row biases are not a weight)")
        values = np.broadcast_to(values.reshape(-1), (rows,))
        return values.reshape(g, rows // g, 1).astype(np.float32)

    def channel_axis_of_output(self, rank: int) -> int:
        """The axis of the layer's output that holds the ``M`` rows of ``W_mat``."""
        return 1 if self.op_type in ("Conv", "ConvTranspose") else rank - 1


def linear_form(op_type: str, attributes: dict[str, Any], weight_shape: tuple[int, ...]) -> LinearForm:
    """The `LinearForm` of a weighted layer (raises `UnsupportedLayer` for what it does not cover)."""
    if op_type not in ("Conv", "ConvTranspose", "Gemm", "MatMul"):
        raise UnsupportedLayer(f"{op_type} is not a weighted layer")
    if op_type in ("Conv", "ConvTranspose") and len(weight_shape) not in (3, 4):
        raise UnsupportedLayer(f"{op_type} with a weight of rank {len(weight_shape)}")
    return LinearForm(op_type, dict(attributes), tuple(weight_shape))
