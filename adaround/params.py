"""AdaRound's hyper-parameters, every one a documented argument (AIMET keeps some as module constants)."""
from __future__ import annotations

from collections.abc import Iterable, Sized
from dataclasses import dataclass
from typing import Any

from quantsim import InvalidArgumentError
from quantsim.errors import warn_at_caller

__all__ = ["AdaroundParameters", "AdaroundSettings", "DEFAULT_ITERATIONS", "DEFAULT_ITERATIONS_BELOW_8_BITS",
           "QUADRATIC_FORMS"]

DEFAULT_ITERATIONS = 10_000  # AIMET's recommendation for weights of 8 bits or more
DEFAULT_ITERATIONS_BELOW_8_BITS = 15_000  # ... and below 8 bits
QUADRATIC_FORMS = ("auto", "exact", "sampled")


@dataclass(frozen=True)
class AdaroundSettings:
    """How each layer is optimised.

    ``num_iterations``: Adam steps per layer. ``reg_param``: weight of the rounding regulariser.
    ``beta_range``: its exponent, annealed (cosine) from the first to the second value after the warm
    start. ``warm_start``: share of the iterations with the regulariser off. ``learning_rate``: Adam's.
    ``columns_per_iteration``: output positions (im2col columns; rows of a MatMul/Gemm input) drawn per
    iteration for layers followed by a nonlinearity: a window of consecutive columns at a random offset.
    ``quadratic_form``: how layers with no following activation (loss quadratic in the weight, known
    exactly from second moments) take their steps, for ``M`` outputs and ``K``-long columns:
    ``"exact"``: the full-data gradient every step (``M K^2`` multiply-adds); ``"sampled"``: the exact
    gradient at an anchor weight, recomputed every ``anchor_interval`` steps, plus the change since the
    anchor measured on ``B = quadratic_columns_per_iteration`` random columns (a control variate, as in
    SVRG: unbiased, and its noise shrinks as the weight nears the anchor; ``2 M K B + M K^2 /
    anchor_interval`` per step; on a 768-wide Gemm it ends within 2% of the exact loss where plain
    mini-batches of 64 columns, as AIMET's, end 36% higher); ``"auto"``: sampled where that is at most
    half the exact cost, ``2 B / K + 1 / anchor_interval <= 1/2``.
    ``memory_budget_bytes``: the most captured layer data kept (columns are subsampled uniformly to fit).
    ``seed``: the sampling generator's seed (runs are reproducible).
    """

    num_iterations: int = DEFAULT_ITERATIONS
    reg_param: float = 0.01
    beta_range: tuple[float, float] = (20.0, 2.0)
    warm_start: float = 0.2
    learning_rate: float = 1e-3
    columns_per_iteration: int = 4096
    quadratic_form: str = "auto"
    quadratic_columns_per_iteration: int = 64
    anchor_interval: int = 10
    memory_budget_bytes: int = 1 << 30
    seed: int = 0

    def __post_init__(self) -> None:
        if int(self.num_iterations) != self.num_iterations or self.num_iterations < 1:
            raise InvalidArgumentError(f"num_iterations must be a positive integer, got {self.num_iterations!r}")
        if not 0 <= self.warm_start < 1:
            raise InvalidArgumentError(f"warm_start must be in [0, 1), got {self.warm_start}")
        if self.reg_param < 0 or self.learning_rate <= 0:
            raise InvalidArgumentError("reg_param must be >= 0 and learning_rate > 0")
        if len(self.beta_range) != 2 or min(self.beta_range) <= 0:
            raise InvalidArgumentError(f"beta_range must be two positive numbers, got {self.beta_range!r}")
        if self.columns_per_iteration < 1:
            raise InvalidArgumentError(f"columns_per_iteration must be >= 1, got {self.columns_per_iteration}")
        if self.quadratic_form not in QUADRATIC_FORMS:
            raise InvalidArgumentError(f"quadratic_form must be one of {QUADRATIC_FORMS}, got {self.quadratic_form!r}")
        if self.anchor_interval < 1:
            raise InvalidArgumentError(f"anchor_interval must be >= 1, got {self.anchor_interval}")
        if self.quadratic_columns_per_iteration < 1:
            raise InvalidArgumentError("quadratic_columns_per_iteration must be >= 1, got "
                                       f"{self.quadratic_columns_per_iteration}")

    def sampled_quadratic(self, inputs_per_column: int) -> bool:
        """Whether a layer with no following activation and ``inputs_per_column`` (``K``) long columns is
        optimised on sampled columns (see ``quadratic_form``)."""
        if self.quadratic_form != "auto":
            return self.quadratic_form == "sampled"
        return 2 * self.quadratic_columns_per_iteration / inputs_per_column + 1 / self.anchor_interval <= 0.5


@dataclass
class AdaroundParameters:
    """AIMET's older parameter object: the calibration data and the defaults of every layer.

    ``data_loader`` yields batches as AIMET's did: feed dicts (``{input name: array}``), arrays (a
    one-input model) or lists/tuples of arrays in model-input order; the first ``num_batches`` are used
    (a sized loader shorter than that is an error at once, as in AIMET). ``default_num_iterations=None``
    picks 10,000 (15,000 when a weight has fewer than 8 bits), as AIMET does.

    ``forward_fn`` / ``forward_pass_callback_args``: AIMET 1.x called ``forward_fn(session, args)`` once,
    only so that its weight quantizers saw the weights and computed their encodings. Here weight
    encodings come from the weights themselves, so both have no effect: giving either warns once.
    """

    data_loader: Iterable[Any]
    num_batches: int
    default_num_iterations: int | None = None
    default_reg_param: float = 0.01
    default_beta_range: tuple[float, float] = (20.0, 2.0)
    default_warm_start: float = 0.2
    forward_fn: Any = None
    forward_pass_callback_args: Any = None

    def __post_init__(self) -> None:
        if int(self.num_batches) != self.num_batches or self.num_batches < 1:
            raise InvalidArgumentError(f"num_batches must be a positive integer, got {self.num_batches!r}")
        if isinstance(self.data_loader, Sized) and len(self.data_loader) < self.num_batches:
            raise InvalidArgumentError(f"AdaroundParameters: cannot take num_batches={self.num_batches} batches from "
                                       f"a data_loader of length {len(self.data_loader)}")
        given = [name for name in ("forward_fn", "forward_pass_callback_args") if getattr(self, name) is not None]
        if given:
            warn_at_caller(f"AdaroundParameters: {' and '.join(given)} {'has' if len(given) == 1 else 'have'} no "
                           "effect: weight encodings are computed from the weights themselves (AIMET 1.x ran "
                           "forward_fn only so that its weight quantizers saw the weights); AdaRound's data comes "
                           "from data_loader")

    def settings(self, min_weight_bits: int) -> AdaroundSettings:
        """The per-layer settings these parameters stand for."""
        iterations = self.default_num_iterations
        if iterations is None:
            iterations = DEFAULT_ITERATIONS_BELOW_8_BITS if min_weight_bits < 8 else DEFAULT_ITERATIONS
        high, low = self.default_beta_range
        return AdaroundSettings(num_iterations=iterations, reg_param=self.default_reg_param, beta_range=(high, low),
                                warm_start=self.default_warm_start)
