"""Small models for BatchNormalization folding and AIMET's quantizer placement (`test_batch_norm_fold`,
`test_aimet_placement`): each is one pattern, with node names distinct from tensor names so that tests can
tell which name survives a fold. ``AIMET_NAMES`` are the encodings names aimet-onnx 2.42 exports for each
(default per-channel config, ``encoding_version="1.0.0"``), measured with aimet-onnx: "kept" when the script
builds the sim on the model as it is, "folded" after ``fold_all_batch_norms_to_weight(model)``."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _model(nodes, inits, shape) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


class _Params:
    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.inits: list[onnx.TensorProto] = []

    def add(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, np.float32), name))
        return name

    def normal(self, name: str, *shape: int, std: float = 0.5) -> str:
        return self.add(name, self.rng.normal(0, std, shape))

    def bn(self, prefix: str, channels: int, spread: float = 1.0) -> list[str]:
        gamma = self.rng.uniform(0.5, 1.5, channels) * np.exp(self.rng.uniform(-spread, spread, channels))
        return [self.add(f"{prefix}.scale", gamma), self.normal(f"{prefix}.B", channels),
                self.normal(f"{prefix}.mean", channels, std=0.3), self.add(f"{prefix}.var", self.rng.uniform(0.5, 2, channels))]


def _bn(p: _Params, x: str, out: str, channels: int) -> onnx.NodeProto:
    return helper.make_node("BatchNormalization", [x] + p.bn("bn", channels), [out], name="bn")


def conv_bn_relu(depthwise: bool = False, seed: int = 0) -> onnx.ModelProto:
    p, c = _Params(seed), 4
    nodes = [helper.make_node("Conv", ["x", p.normal("conv.weight", c, 1 if depthwise else c, 3, 3), p.normal("conv.bias", c)],
                              ["conv_out"], name="conv", pads=[1, 1, 1, 1], group=c if depthwise else 1),
             _bn(p, "conv_out", "bn_out", c), helper.make_node("Relu", ["bn_out"], ["y"], name="relu")]
    return _model(nodes, p.inits, [1, c, 8, 8])


def conv_act(depthwise: bool = False, act: str = "Relu", seed: int = 0) -> onnx.ModelProto:
    p, c = _Params(seed), 4
    nodes = [helper.make_node("Conv", ["x", p.normal("conv.weight", c, 1 if depthwise else c, 3, 3), p.normal("conv.bias", c)],
                              ["conv_out"], name="conv", pads=[1, 1, 1, 1], group=c if depthwise else 1)]
    if act == "Relu":
        nodes.append(helper.make_node("Relu", ["conv_out"], ["y"], name="relu"))
    else:
        nodes.append(helper.make_node("Clip", ["conv_out", p.add("lo", 0.0), p.add("hi", 6.0)], ["y"], name="relu6"))
    return _model(nodes, p.inits, [1, c, 8, 8])


def add_relu(seed: int = 0) -> onnx.ModelProto:
    p, c = _Params(seed), 4
    nodes = [helper.make_node("Conv", ["x", p.normal("c1.weight", c, c, 3, 3)], ["a"], name="c1", pads=[1] * 4),
             helper.make_node("Conv", ["x", p.normal("c2.weight", c, c, 3, 3)], ["b"], name="c2", pads=[1] * 4),
             helper.make_node("Add", ["a", "b"], ["s"], name="add"), helper.make_node("Relu", ["s"], ["y"], name="relu")]
    return _model(nodes, p.inits, [1, c, 8, 8])


def concat(seed: int = 0) -> onnx.ModelProto:
    p, c = _Params(seed), 4
    nodes = [helper.make_node("Conv", ["x", p.normal("c1.weight", c, c, 3, 3)], ["a"], name="c1", pads=[1] * 4),
             helper.make_node("Relu", ["a"], ["ar"], name="r1"),
             helper.make_node("Conv", ["x", p.normal("c2.weight", c, c, 3, 3)], ["b"], name="c2", pads=[1] * 4),
             helper.make_node("Concat", ["ar", "b"], ["y"], name="cat", axis=1)]
    return _model(nodes, p.inits, [1, c, 8, 8])


def bn_conv(pads: int = 0, seed: int = 0) -> onnx.ModelProto:
    p, c = _Params(seed), 4
    nodes = [_bn(p, "x", "bn_out", c),
             helper.make_node("Conv", ["bn_out", p.normal("conv.weight", c, c, 1 + 2 * pads, 1 + 2 * pads),
                                       p.normal("conv.bias", c)], ["y"], name="conv", pads=[pads] * 4)]
    return _model(nodes, p.inits, [1, c, 8, 8])


def matmul_bn(seed: int = 0) -> onnx.ModelProto:
    p = _Params(seed)
    nodes = [helper.make_node("MatMul", ["x", p.normal("fc.weight", 6, 5)], ["mm"], name="fc"), _bn(p, "mm", "y", 5)]
    return _model(nodes, p.inits, [3, 6])


def gemm_bn(seed: int = 0) -> onnx.ModelProto:
    p = _Params(seed)
    nodes = [helper.make_node("Gemm", ["x", p.normal("fc.weight", 5, 6), p.normal("fc.bias", 5)], ["mm"], name="fc",
                              transB=1), _bn(p, "mm", "y", 5)]
    return _model(nodes, p.inits, [3, 6])


def convT_bn(seed: int = 0) -> onnx.ModelProto:
    p = _Params(seed)
    nodes = [helper.make_node("ConvTranspose", ["x", p.normal("ct.weight", 4, 3, 2, 2)], ["ct"], name="ct", strides=[2, 2]),
             _bn(p, "ct", "y", 3)]
    return _model(nodes, p.inits, [1, 4, 5, 5])


def bn_flatten_gemm(seed: int = 0) -> onnx.ModelProto:
    p = _Params(seed)
    nodes = [_bn(p, "x", "bn_out", 4), helper.make_node("Flatten", ["bn_out"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", p.normal("fc.weight", 3, 16), p.normal("fc.bias", 3)], ["y"], name="fc", transB=1)]
    return _model(nodes, p.inits, [2, 4, 2, 2])


def standalone_bn(seed: int = 0) -> onnx.ModelProto:
    p = _Params(seed)
    return _model([helper.make_node("Relu", ["x"], ["r"], name="relu"), _bn(p, "r", "y", 4)], p.inits, [1, 4, 8, 8])


def matmul_add_relu(seed: int = 0) -> onnx.ModelProto:
    p = _Params(seed)
    nodes = [helper.make_node("MatMul", ["x", p.normal("fc.weight", 6, 5)], ["mm"], name="fc"),
             helper.make_node("Add", ["mm", p.normal("fc.bias", 5)], ["s"], name="add"),
             helper.make_node("Relu", ["s"], ["y"], name="relu")]
    return _model(nodes, p.inits, [3, 6])


def conv_relu_shaped(weight: tuple[int, ...], group: int, data: list[int], transpose: bool = False,
                     seed: int = 0) -> onnx.ModelProto:
    p = _Params(seed)
    name = "ct" if transpose else "conv"
    out = "ct" if transpose else "conv_out"
    geometry = {"strides": [2, 2]} if transpose else {"pads": [1] * (2 * (len(data) - 2))}
    nodes = [helper.make_node("ConvTranspose" if transpose else "Conv", ["x", p.normal(f"{name}.weight", *weight)], [out],
                              name=name, group=group, **geometry),
             helper.make_node("Relu", [out], ["y"], name="relu")]
    return _model(nodes, p.inits, data)


MODELS = {
    "conv_bn_relu": conv_bn_relu,
    "dw_conv_bn_relu": lambda: conv_bn_relu(depthwise=True),
    "conv_relu": conv_act,
    "dw_conv_relu": lambda: conv_act(depthwise=True),
    "conv_relu6": lambda: conv_act(act="Relu6"),
    "dw_conv_relu6": lambda: conv_act(depthwise=True, act="Relu6"),
    "add_relu": add_relu,
    "concat": concat,
    "bn_conv": bn_conv,
    "matmul_bn": matmul_bn,
    "gemm_bn": gemm_bn,
    "convT_bn": convT_bn,
    "bn_flatten_gemm": bn_flatten_gemm,
    "standalone_bn": standalone_bn,
    "matmul_add_relu": matmul_add_relu,
    "conv3d_relu": lambda: conv_relu_shaped((2, 2, 3, 3, 3), 1, [1, 2, 4, 4, 4]),
    "dw_mult_relu": lambda: conv_relu_shaped((4, 1, 3, 3), 2, [1, 2, 6, 6]),  # depthwise, channel multiplier 2
    "grouped_relu": lambda: conv_relu_shaped((4, 2, 3, 3), 2, [1, 4, 6, 6]),  # grouped, not depthwise
    "dw_convT_relu": lambda: conv_relu_shaped((3, 1, 2, 2), 3, [1, 3, 4, 4], transpose=True),
}

_W = ("conv.weight",)
AIMET_NAMES: dict[str, dict[str, tuple[tuple[str, ...], tuple[str, ...]]]] = {  # {(activations, params)}
    "conv_bn_relu": {"kept": (("bn_out", "conv_out", "x", "y"), ("bn.scale", "conv.weight")), "folded": (("x", "y"), _W)},
    "dw_conv_bn_relu": {"kept": (("bn_out", "conv_out", "x", "y"), ("bn.scale", "conv.weight")),
                        "folded": (("conv_out", "x", "y"), _W)},
    "conv_relu": {"kept": (("x", "y"), _W), "folded": (("x", "y"), _W)},
    "dw_conv_relu": {"kept": (("conv_out", "x", "y"), _W), "folded": (("conv_out", "x", "y"), _W)},
    "conv_relu6": {"kept": (("hi", "lo", "x", "y"), _W), "folded": (("hi", "lo", "x", "y"), _W)},
    "dw_conv_relu6": {"kept": (("conv_out", "hi", "lo", "x", "y"), _W), "folded": (("conv_out", "hi", "lo", "x", "y"), _W)},
    "add_relu": {"kept": (("a", "b", "x", "y"), ("c1.weight", "c2.weight")),
                 "folded": (("a", "b", "x", "y"), ("c1.weight", "c2.weight"))},
    "concat": {"kept": (("ar", "b", "x", "y"), ("c1.weight", "c2.weight")),
               "folded": (("ar", "b", "x", "y"), ("c1.weight", "c2.weight"))},
    "bn_conv": {"kept": (("bn_out", "x", "y"), ("bn.scale", "conv.weight")), "folded": (("x", "y"), _W)},
    "matmul_bn": {"kept": (("mm", "x", "y"), ("bn.scale", "fc.weight")), "folded": (("x", "y"), ("fc.weight",))},
    "gemm_bn": {"kept": (("mm", "x", "y"), ("bn.scale", "fc.weight")), "folded": (("x", "y"), ("fc.weight",))},
    "convT_bn": {"kept": (("ct", "x", "y"), ("bn.scale", "ct.weight")), "folded": (("x", "y"), ("ct.weight",))},
    "bn_flatten_gemm": {"kept": (("bn_out", "x", "y"), ("bn.scale", "fc.weight")), "folded": (("x", "y"), ("fc.weight",))},
    "standalone_bn": {"kept": (("r", "x", "y"), ("bn.scale",)), "folded": (("r", "x", "y"), ("bn.scale",))},
    "matmul_add_relu": {"kept": (("x", "y"), ("fc.weight",)), "folded": (("x", "y"), ("fc.weight",))},
    "conv3d_relu": {"kept": (("conv_out", "x", "y"), _W), "folded": (("conv_out", "x", "y"), _W)},
    "dw_mult_relu": {"kept": (("conv_out", "x", "y"), _W), "folded": (("conv_out", "x", "y"), _W)},
    "grouped_relu": {"kept": (("x", "y"), _W), "folded": (("x", "y"), _W)},
    "dw_convT_relu": {"kept": (("ct", "x", "y"), ("ct.weight",)), "folded": (("ct", "x", "y"), ("ct.weight",))},
}

#: Encodings aimet-onnx writes that the sim leaves out on purpose: Clip's constant bounds (quantized as model
#: inputs by AIMET; kept constant here so that QDQ runtimes fuse the Clip, and on their own grid they are exact).
CLIP_BOUNDS = frozenset({"hi", "lo"})

#: What ``fold_all_batch_norms_to_weight`` returns for each model (AIMET's pairs: (layer, BN) names, after-layer
#: folds then before-layer folds) and the nodes left, as aimet-onnx does it.
AIMET_FOLDS = {
    "conv_bn_relu": ([("conv", "bn")], [], [("Conv", "conv"), ("Relu", "relu")]),
    "dw_conv_bn_relu": ([("conv", "bn")], [], [("Conv", "conv"), ("Relu", "relu")]),
    "bn_conv": ([], [("conv", "bn")], [("Conv", "conv")]),
    "matmul_bn": ([("fc", "bn")], [], [("Gemm", "fc")]),
    "gemm_bn": ([("fc", "bn")], [], [("Gemm", "fc")]),
    "convT_bn": ([("ct", "bn")], [], [("ConvTranspose", "ct")]),
    "bn_flatten_gemm": ([], [("fc", "bn")], [("Flatten", "flat"), ("Gemm", "fc")]),
    "standalone_bn": ([], [], [("Relu", "relu"), ("BatchNormalization", "bn")]),
    "conv_relu": ([], [], [("Conv", "conv"), ("Relu", "relu")]),
}


def input_feed(model: onnx.ModelProto, seed: int = 1) -> dict[str, np.ndarray]:
    shape = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}
