"""Target profiles: what the hardware that runs an export can execute (`profile`), and the legality of a
sim's precisions on it (`legality`). See docs/target-profiles.md."""
from quantsim.target.legality import Finding, LegalityReport, NodeVerdict, TensorPrecision, analyze
from quantsim.target.profile import SHIPPED_TARGETS, Kernel, TargetProfile, from_quantsim_config, load_target

__all__ = ["TargetProfile", "Kernel", "load_target", "from_quantsim_config", "SHIPPED_TARGETS", "analyze",
           "LegalityReport", "NodeVerdict", "Finding", "TensorPrecision"]
