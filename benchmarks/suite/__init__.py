"""Real-model benchmark suite: PyPI-shipped models, real inputs, W8A8 sim vs onnxruntime quantize_static."""
