"""quantsim: quantization simulation and deployment for ONNX models (public API filled in below)."""
from .dtypes import QuantizationDataType, QuantScheme, float16, float32, int2, int4, int8, int16, qtype
from .spec import PerBlock, PerChannel, PerTensor, QSpec

__version__ = "0.1.0"
