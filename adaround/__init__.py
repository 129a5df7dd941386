"""Weight-side post-training techniques built on quantsim's public API: AdaRound, Sequential MSE, CLE."""

__all__: list[str] = []
