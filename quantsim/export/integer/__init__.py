"""The fully integer export: one lowering rule per op family on a shared lowering context."""

__all__: list[str] = []
