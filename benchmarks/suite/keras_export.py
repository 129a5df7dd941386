"""Keras applications as ONNX through tf2onnx, for `benchmarks.bench_light --torch` (same folder).

    <python with tensorflow-cpu 2.15 + tf2onnx 1.16 + numpy<2> -m benchmarks.suite.keras_export [--out DIR]
        [--models MobileNetV2 ...]

A third exporter besides torch's two: tf2onnx writes NHWC models whose convolutions sit between Transposes,
with Keras' input Rescaling as Mul/Add and BatchNorm folded into the Conv. Runs in its own environment (tf2onnx
needs numpy < 2), never in quantsim's. Nothing is downloaded: ``weights=None`` from a fixed seed, BatchNorm
moving statistics set from one training-mode batch of N(0, 1) images (momentum 0). Files
``DIR/keras_<model>.tf2onnx.onnx``; a model tf2onnx cannot convert (it leaves ``PartitionedCall`` for grouped
convolutions: RegNet, ConvNeXt) is reported and not written. Random weights: op coverage, float ops and
latency, not accuracy.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from benchmarks.suite.exporting import export_each

DEFAULT_OUT = Path.home() / ".cache" / "quantsim" / "models" / "torch"
MODELS = {"MobileNetV2": 224, "MobileNetV3Small": 224, "MobileNetV3Large": 224, "EfficientNetB0": 224,
          "EfficientNetV2B0": 224, "ResNet50": 224, "ResNet50V2": 224, "DenseNet121": 224, "NASNetMobile": 224,
          "Xception": 299, "InceptionV3": 299}


def application(name: str):
    """Keras application ``name`` with seeded random weights and BatchNorm statistics from one batch."""
    import numpy as np
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    size = MODELS[name]
    model = getattr(tf.keras.applications, name)(weights=None, input_shape=(size, size, 3))
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            layer.momentum = 0.0  # the moving statistics become this batch's
    model(np.random.default_rng(0).standard_normal((8, size, size, 3)).astype(np.float32), training=True)
    return model


def export(name: str, out: Path, opset: int = 17, target: Path | None = None) -> Path:
    import onnx
    import tensorflow as tf
    import tf2onnx

    model = application(name)
    size = MODELS[name]
    target = target or out / f"keras_{name}.tf2onnx.onnx"
    spec = (tf.TensorSpec((1, size, size, 3), tf.float32, name="input"),)
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=opset)
    onnx.checker.check_model(proto)  # tf2onnx writes PartitionedCall where it cannot convert
    onnx.save(proto, str(target))
    return target


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    export_each((name, lambda name=name: export(name, out)) for name in args.models)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
