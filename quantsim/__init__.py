"""quantsim: quantization simulation and deployment for ONNX models on stock onnxruntime.

AIMET-compatible surface: ``QuantizationSimModel``, ``compute_encodings``, quantizer objects in
``sim.qc_quantize_op_dict``, ``export``/``load_encodings_to_sim``/``set_and_freeze_param_encodings``
with AIMET's encodings formats, and ``to_onnx_qdq``/``from_onnx_qdq``. The sim itself is a plain ONNX
graph of QuantizeLinear/DequantizeLinear (or Clip, or Cast) nodes.
"""
from quantsim.sim.config import ConfigError, QuantsimConfig, load_config
from quantsim.core.dtypes import (
    QuantizationDataType,
    QuantScheme,
    float16,
    float32,
    int2,
    int4,
    int8,
    int16,
    qtype,
)
from quantsim.encodings import EncodingFormatError
from quantsim.core.numerics import Encoding
from quantsim.export.integer.context import IntegerExportError
from quantsim.prepare import prepare
from quantsim.prepare.common import PrepareError, PrepareWarning
from quantsim.sim.quantizer import QcQuantizeOp, TfEncoding
from quantsim.encodings.transfer import EncodingMismatch, EncodingMismatchError, load_encodings_to_sim
from quantsim.sim.model import QuantizationSimModel
from quantsim.core.spec import PerBlock, PerChannel, PerTensor, QSpec

__version__ = "0.1.0"

__all__ = [
    "QuantizationSimModel",
    "QuantScheme",
    "QuantizationDataType",
    "qtype",
    "int2",
    "int4",
    "int8",
    "int16",
    "float16",
    "float32",
    "QSpec",
    "PerTensor",
    "PerChannel",
    "PerBlock",
    "Encoding",
    "QcQuantizeOp",
    "TfEncoding",
    "load_encodings_to_sim",
    "EncodingMismatch",
    "EncodingMismatchError",
    "EncodingFormatError",
    "ConfigError",
    "QuantsimConfig",
    "load_config",
    "prepare",
    "PrepareError",
    "PrepareWarning",
    "IntegerExportError",
    "__version__",
]
