"""Benchmarks and real-model helpers for quantsim (not part of the installed package)."""
