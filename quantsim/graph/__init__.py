"""Read-only graph facts: the graph index, per-op facts, tensor roles, model I/O and onnxruntime sessions."""

__all__: list[str] = []
