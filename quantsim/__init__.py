"""quantsim: quantization simulation and deployment for ONNX models on stock onnxruntime.

AIMET-compatible surface: ``QuantizationSimModel``, ``compute_encodings``, quantizer objects in
``sim.qc_quantize_op_dict``, ``export``/``load_encodings_to_sim``/``set_and_freeze_param_encodings``
with AIMET's encodings formats, and ``to_onnx_qdq``/``from_onnx_qdq``. The sim itself is a plain ONNX
graph of QuantizeLinear/DequantizeLinear (or Clip, or Cast) nodes.
"""
from quantsim.batch_norm_fold import fold_all_batch_norms_to_weight
from quantsim.core.dtypes import (
    QuantizationDataType,
    QuantScheme,
    float8e4m3fn,
    float8e5m2,
    float16,
    float32,
    int2,
    int4,
    int8,
    int16,
    qtype,
)
from quantsim.core.numerics import (
    Encoding,
    broadcast_param,
    dequantize,
    encoding_from_range,
    fake_quantize,
    grid_bounds,
    quantize,
)
from quantsim.core.spec import LPBQ, PerBlock, PerChannel, PerTensor, QSpec
from quantsim.encodings.transfer import EncodingMismatch, load_encodings_to_sim
from quantsim.errors import (
    AimetDifferenceWarning,
    CalibrationError,
    ConfigError,
    EncodingFormatError,
    EncodingMismatchError,
    ExportLegalityError,
    IntegerExportError,
    InvalidArgumentError,
    InvalidStateError,
    InvalidTypeError,
    NotSupportedError,
    PrepareError,
    PrepareWarning,
    QuantsimError,
    QuantsimWarning,
    SessionError,
    TargetError,
    UnknownQuantizerError,
)
from quantsim.export.from_encodings import encodings_to_onnx_qdq
from quantsim.export.legality import legality_report
from quantsim.prepare import prepare
from quantsim.sim.aimet_surface import clamp_activation_encodings
from quantsim.sim.calibrate import compute_encodings
from quantsim.sim.capture import Capturer, StagedCapturer, TensorCache
from quantsim.sim.config import QuantsimConfig, load_config
from quantsim.sim.exception_rules import apply_exception_rules
from quantsim.sim.groups import QuantizerGroup
from quantsim.sim.layers import FollowingActivation, FollowingBatchNorm, WeightedLayer
from quantsim.sim.model import QuantizationSimModel
from quantsim.sim.model_view import ModelView
from quantsim.sim.precision_setters import (
    deciding_quantizer,
    set_blockwise_quantization_for_weights,
    set_grouped_blockwise_quantization_for_weights,
    set_lpbq_for_params,
    set_param_type,
)
from quantsim.sim.quantizer import QcQuantizeOp, TfEncoding
from quantsim.sim.quantizer_aimet import OpMode
from quantsim.sim.state import SimState
from quantsim.target import LegalityReport, TargetProfile, load_target

__version__ = "0.1.0"

__all__ = [
    "QuantizationSimModel",
    "compute_encodings",
    "encodings_to_onnx_qdq",
    "set_param_type",
    "apply_exception_rules",
    "deciding_quantizer",
    "set_blockwise_quantization_for_weights",
    "set_lpbq_for_params",
    "set_grouped_blockwise_quantization_for_weights",
    "QuantScheme",
    "QuantizationDataType",
    "qtype",
    "int2",
    "int4",
    "int8",
    "int16",
    "float16",
    "float32",
    "float8e4m3fn",
    "float8e5m2",
    "QSpec",
    "PerTensor",
    "PerChannel",
    "PerBlock",
    "LPBQ",
    "Encoding",
    "encoding_from_range",
    "quantize",
    "dequantize",
    "fake_quantize",
    "broadcast_param",
    "grid_bounds",
    "WeightedLayer",
    "FollowingActivation",
    "FollowingBatchNorm",
    "QuantizerGroup",
    "SimState",
    "TensorCache",
    "Capturer",
    "StagedCapturer",
    "QcQuantizeOp",
    "TfEncoding",
    "OpMode",
    "ModelView",
    "clamp_activation_encodings",
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
    "AimetDifferenceWarning",
    "fold_all_batch_norms_to_weight",
    "IntegerExportError",
    "QuantsimError",
    "QuantsimWarning",
    "InvalidArgumentError",
    "InvalidTypeError",
    "InvalidStateError",
    "NotSupportedError",
    "CalibrationError",
    "SessionError",
    "UnknownQuantizerError",
    "TargetError",
    "ExportLegalityError",
    "TargetProfile",
    "load_target",
    "legality_report",
    "LegalityReport",
    "__version__",
]
