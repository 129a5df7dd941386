"""Weight-side post-training techniques built on quantsim's public API: AdaRound, Sequential MSE and
cross-layer equalization. Numpy only (no torch)."""
from adaround.apply import LayerReport, apply_adaround
from adaround.cle import equalize_model
from adaround.legacy import Adaround
from adaround.params import AdaroundParameters, AdaroundSettings
from adaround.seq_mse import SeqMseParams, SequentialMse, apply_seq_mse

__all__ = [
    "apply_adaround",
    "Adaround",
    "AdaroundParameters",
    "AdaroundSettings",
    "LayerReport",
    "apply_seq_mse",
    "SeqMseParams",
    "SequentialMse",
    "equalize_model",
]
