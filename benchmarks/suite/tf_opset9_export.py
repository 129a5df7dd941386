"""Keras models through tf2onnx at opset 9 (and 13 to compare), for `benchmarks.bench_tf9`.

    <python with tensorflow-cpu 2.15 + tf2onnx 1.16 + numpy<2> -m benchmarks.suite.tf_opset9_export
        [--out DIR] [--opset 9 13] [--models MobileNetV2 upsample ...]

Opset 9 is where tf2onnx spells many ops the old way: ``Upsample`` (no Resize), ``Slice`` and ``Pad`` with
attributes, ``Clip`` with ``min``/``max`` attributes, ``BatchNormalization`` without ``spatial``, ``Scan``-9,
``Cast``s around integer ops; quantsim converts such models to opset 13 with onnx's version converter before
anything else. Two kinds of models: Keras applications (`keras_export.application`: ``weights=None`` from a
fixed seed, BatchNorm statistics from one training-mode batch) and small hand-built Keras models, each
exercising one thing opset 9 spells differently (named below). Nothing is downloaded. Files
``DIR/<model>.opset<N>.onnx`` with a sidecar ``DIR/<model>.opset<N>.npz``: per graph input, ``FEEDS`` feeds
stacked on a new first axis (``npz[name][k]`` is feed k; images N(0, 1) in NHWC, token ids uniform in the
vocabulary). A model tf2onnx refuses at an opset is reported and not written.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from benchmarks.suite.exporting import export_each
from benchmarks.suite.keras_export import MODELS as APPLICATION_SIZES
from benchmarks.suite.keras_export import application

DEFAULT_OUT = Path.home() / ".cache" / "quantsim" / "models" / "tf9"
APPLICATIONS = ("MobileNetV2", "MobileNetV3Small", "ResNet50", "EfficientNetB0", "DenseNet121")
FEEDS = 6
VOCABULARY = 200


def _small_models() -> dict[str, Callable]:
    """Builders of the hand-built models: name -> () -> keras.Model (built inside, so tensorflow is imported
    only when a model is exported)."""
    import tensorflow as tf

    layers = tf.keras.layers

    def image(size: int = 32, channels: int = 3):
        return tf.keras.Input((size, size, channels), batch_size=1, name="input")

    def resize(size=None, factor: int = 2, method: str = "nearest"):
        """TF1's resize (``half_pixel_centers=False``, the form opset 9's Upsample can express; Keras 2's
        UpSampling2D and ``tf.image.resize`` use half-pixel centers, which tf2onnx refuses below opset 11)."""
        op = (tf.compat.v1.image.resize_nearest_neighbor if method == "nearest"
              else tf.compat.v1.image.resize_bilinear)
        return layers.Lambda(lambda t: op(t, size or (t.shape[1] * factor, t.shape[2] * factor)))

    def head(x, classes: int = 10):
        return layers.Dense(classes, activation="softmax")(layers.GlobalAveragePooling2D()(x))

    def upsample():  # opset 9: Upsample (nearest and linear), no Resize; UpSampling2D's resize, TF1-style
        x = image()
        y = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
        y = layers.MaxPooling2D()(y)
        y = resize()(y)
        y = layers.Conv2D(8, 3, padding="same", activation="relu")(y)
        y = resize(method="bilinear")(y)
        return tf.keras.Model(x, head(layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(y)))

    def conv_transpose():  # ConvTranspose between NHWC Transposes
        x = image()
        y = layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(x)
        y = layers.Conv2DTranspose(8, 3, strides=2, padding="same", activation="relu")(y)
        return tf.keras.Model(x, layers.Conv2D(2, 1)(y))

    def separable():  # depthwise + pointwise Conv
        x = image()
        y = layers.SeparableConv2D(16, 3, padding="same", activation="relu")(x)
        y = layers.SeparableConv2D(16, 3, strides=2, padding="same")(y)
        return tf.keras.Model(x, head(layers.ReLU(6.0)(y)))

    def batchnorm():  # BatchNormalization that no Conv absorbs (after an Add, after a Dense)
        x = image()
        a = layers.Conv2D(8, 3, padding="same")(x)
        b = layers.Conv2D(8, 1, padding="same")(x)
        y = layers.BatchNormalization()(layers.Add()([a, b]))
        y = layers.Activation("relu")(y)
        y = layers.GlobalAveragePooling2D()(y)
        y = layers.BatchNormalization()(layers.Dense(16)(y))
        return tf.keras.Model(x, layers.Dense(10, activation="softmax")(layers.Activation("relu")(y)))

    def flatten_dense():  # Flatten -> Dense: Reshape + MatMul + Add
        x = image(16)
        y = layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(x)
        y = layers.Dense(32, activation="relu")(layers.Flatten()(y))
        return tf.keras.Model(x, layers.Dense(10, activation="softmax")(y))

    def global_pool():  # GlobalAveragePooling and GlobalMaxPooling (ReduceMean / ReduceMax with axes attributes)
        x = image()
        y = layers.Conv2D(16, 3, padding="same", activation="relu")(x)
        y = layers.Concatenate()([layers.GlobalAveragePooling2D()(y), layers.GlobalMaxPooling2D()(y)])
        return tf.keras.Model(x, layers.Dense(10, activation="softmax")(y))

    def text(cell):  # Embedding (Gather on Cast ids) + LSTM/GRU (ONNX LSTM/GRU or a Loop)
        def build():
            ids = tf.keras.Input((20,), batch_size=1, dtype="int32", name="tokens")
            y = layers.Embedding(VOCABULARY, 16)(ids)
            y = cell(24)(y)
            return tf.keras.Model(ids, layers.Dense(4, activation="softmax")(y))
        return build

    def unet():  # encoder-decoder: Concatenate skips, UpSampling2D and Conv2DTranspose, per-pixel softmax
        x = image()
        e1 = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
        e2 = layers.Conv2D(16, 3, padding="same", activation="relu")(layers.MaxPooling2D()(e1))
        b = layers.Conv2D(32, 3, padding="same", activation="relu")(layers.MaxPooling2D()(e2))
        d2 = layers.Conv2D(16, 3, padding="same", activation="relu")(
            layers.Concatenate()([resize()(b), e2]))
        d1 = layers.Conv2D(8, 3, padding="same", activation="relu")(
            layers.Concatenate()([layers.Conv2DTranspose(8, 2, strides=2)(d2), e1]))
        return tf.keras.Model(x, layers.Conv2D(3, 1, activation="softmax")(d1))

    def image_resize():  # resize (bilinear, nearest) to a fixed size, a non-integer factor
        x = image()
        y = layers.Conv2D(8, 3, padding="same", activation="relu")(x)
        y = resize((48, 48), method="bilinear")(y)
        y = layers.Conv2D(8, 3, strides=2, padding="same", activation="relu")(y)
        y = resize((32, 32))(y)
        return tf.keras.Model(x, head(y))

    def data_movement():  # Pad, Slice, Squeeze, Cast, clip_by_value (Min/Max), ReLU6 (Clip with attributes)
        x = image()
        y = layers.Conv2D(8, 3, activation="relu")(x)
        y = layers.ZeroPadding2D(((1, 2), (2, 1)))(y)
        y = layers.Lambda(lambda t: tf.pad(t, [[0, 0], [1, 1], [1, 1], [0, 0]], mode="REFLECT"))(y)
        y = layers.Lambda(lambda t: t[:, 2:30, 1:29, :])(y)
        y = layers.Conv2D(8, 3, padding="same")(y)
        y = layers.Lambda(lambda t: tf.clip_by_value(t, -1.5, 2.5))(y)
        y = layers.Lambda(lambda t: tf.cast(tf.cast(t * 4.0, tf.int32), tf.float32) / 4.0)(y)
        y = layers.ReLU(6.0)(layers.Conv2D(8, 3, strides=2, padding="same")(y))
        y = layers.Lambda(lambda t: tf.reduce_mean(t, axis=[1, 2], keepdims=True))(y)
        y = layers.Lambda(lambda t: tf.squeeze(t, axis=[1, 2]))(y)
        return tf.keras.Model(x, layers.Dense(10, activation="softmax")(y))

    return {"upsample": upsample, "conv_transpose": conv_transpose, "separable": separable,
            "batchnorm": batchnorm, "flatten_dense": flatten_dense, "global_pool": global_pool,
            "lstm_text": text(layers.LSTM), "gru_text": text(layers.GRU), "unet": unet,
            "image_resize": image_resize, "data_movement": data_movement}


SMALL = ("upsample", "conv_transpose", "separable", "batchnorm", "flatten_dense", "global_pool", "lstm_text",
         "gru_text", "unet", "image_resize", "data_movement")


def _build(name: str):
    """The Keras model ``name`` with its weights and BatchNorm statistics set deterministically."""
    import numpy as np
    import tensorflow as tf

    if name in APPLICATION_SIZES:
        return application(name)
    tf.keras.utils.set_random_seed(0)
    model = _small_models()[name]()
    rng = np.random.default_rng(2)
    for layer in model.layers:  # Keras' zero biases would be dropped by tf2onnx (an Add of zeros)
        if getattr(layer, "bias", None) is not None:
            layer.bias.assign(0.1 * rng.standard_normal(layer.bias.shape).astype(np.float32))
    norms = [layer for layer in model.layers if isinstance(layer, tf.keras.layers.BatchNormalization)]
    if norms:
        for layer in norms:
            layer.momentum = 0.0
        model(_feeds(model, np.random.default_rng(1), 8, batch=8)[0], training=True)
    return model


def _feeds(model, rng, count: int, batch: int = 1) -> list[list]:
    """``count`` feeds for the Keras model (a list per feed, in input order)."""
    import numpy as np

    feeds = []
    for _ in range(count):
        feed = []
        for spec in model.inputs:
            shape = (batch, *spec.shape[1:])
            if spec.dtype.is_integer:
                feed.append(rng.integers(0, VOCABULARY, shape).astype(spec.dtype.as_numpy_dtype))
            else:
                feed.append(rng.standard_normal(shape).astype(np.float32))
        feeds.append(feed)
    return feeds


def export(name: str, out: Path, opset: int) -> Path:
    import numpy as np
    import onnx
    import tensorflow as tf
    import tf2onnx

    model = _build(name)
    spec = tuple(tf.TensorSpec((1, *i.shape[1:]), i.dtype, name=i.name.split(":")[0]) for i in model.inputs)
    proto, _ = tf2onnx.convert.from_keras(model, input_signature=spec, opset=opset)
    onnx.checker.check_model(proto)  # tf2onnx writes PartitionedCall where it cannot convert
    stem = out / f"{name}.opset{opset}"
    onnx.save(proto, f"{stem}.onnx")
    feeds = _feeds(model, np.random.default_rng(0), FEEDS)
    graph_inputs = [i.name for i in proto.graph.input]
    np.savez(f"{stem}.npz", **{graph_input: np.stack([feed[k] for feed in feeds])
                               for k, graph_input in enumerate(graph_inputs)})
    return Path(f"{stem}.onnx")


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--opset", nargs="+", type=int, default=[9, 13])
    parser.add_argument("--models", nargs="+", choices=APPLICATIONS + SMALL, default=list(APPLICATIONS + SMALL))
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    export_each((f"{name} opset {opset}", lambda name=name, opset=opset: export(name, out, opset))
                for name in args.models for opset in args.opset)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
