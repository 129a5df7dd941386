"""Integer reference executor: runs an exported integer model in numpy with int32 accumulation and
fixed-point requantization, and compares it with onnxruntime op by op."""
from quantsim.export.reference.executor import (
    SUPPORTED_OPS,
    IntegerReferenceExecutor,
    compare_with_onnxruntime,
    run_integer_model,
)

__all__ = ["IntegerReferenceExecutor", "run_integer_model", "compare_with_onnxruntime", "SUPPORTED_OPS"]
