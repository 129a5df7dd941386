"""Calibration: the statistics graph, histograms, the registered calibration schemes and the calibration run."""

__all__: list[str] = []
