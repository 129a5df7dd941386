"""quantsim: quantization simulation and deployment for ONNX models on stock onnxruntime.

AIMET-compatible surface: ``QuantizationSimModel``, ``compute_encodings``, quantizer objects in
``sim.qc_quantize_op_dict``, ``export``/``load_encodings_to_sim``/``set_and_freeze_param_encodings``
with AIMET's encodings formats, and ``to_onnx_qdq``/``from_onnx_qdq``. The sim itself is a plain ONNX
graph of QuantizeLinear/DequantizeLinear (or Clip, or Cast) nodes.
"""
from .config import ConfigError, QuantsimConfig, load_config
from .dtypes import QuantizationDataType, QuantScheme, float16, float32, int2, int4, int8, int16, qtype
from .encodings import EncodingFormatError
from .numerics import Encoding
from .export.lowering_context import IntegerExportError
from .prepare import prepare
from .prepare.common import PrepareError, PrepareWarning
from .quantizer import QcQuantizeOp, TfEncoding
from .sim_encodings import EncodingMismatch, EncodingMismatchError, load_encodings_to_sim
from .sim_model import QuantizationSimModel
from .spec import PerBlock, PerChannel, PerTensor, QSpec

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
