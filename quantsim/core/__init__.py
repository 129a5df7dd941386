"""Pure numerics and types: data types, granularity specs, scale/zero-point maths, fixed point (numpy only, no I/O)."""

__all__: list[str] = []
