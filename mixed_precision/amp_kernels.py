"""Which AMP candidates each quantizer group may take: the ``supported_kernels`` of the sim's config
(aimet-onnx's ``use_all_amp_candidates=False``).

A quantsim config may list, under ``defaults`` and per op type, the kernels the target runs:
``{"activation": {"bitwidth": 16, "dtype": "int"}, "param": {"bitwidth": 8, "dtype": "int"}}`` (an op type's
entries may give the activation alone). As in aimet-onnx 2.42, a quantizer belongs to the op types that
write its tensors (a model input: the ops reading it; a parameter: the ops using it); a candidate is
supported by a group when, for every quantizer of the group, it is one of its op types' kernels (an
activation-only kernel matches the candidate's activation type), or, when none of its op types lists
kernels, one of the defaults. A config without kernels, or ``use_all_amp_candidates=True``, allows every
candidate everywhere. A group left without a candidate is an error naming it and its op types.

Where a group does not support a candidate, "that candidate everywhere" gives the group its costliest
supported candidate instead (AIMET: the group's first candidate).

A sim built with a ``target`` profile narrows the lists further, whatever ``use_all_amp_candidates`` says
(`target_candidates`): a candidate stays for a group only when the target takes its types on the group's
quantizers, the other groups at the baseline (`QuantizationSimModel.target_findings`). A group left with
no legal candidate is a `TargetError` naming it and the target's first objection.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mixed_precision.presets import Precision
from quantsim import ConfigError, QuantizationDataType, QuantizationSimModel, QuantizerGroup, TargetError, qtype

__all__ = ["supported_candidates", "target_candidates"]


def _kernel(entry: Mapping[str, Any]) -> tuple[qtype, qtype | None]:
    def side(value: Mapping[str, Any]) -> qtype:
        return qtype.from_legacy_repr(QuantizationDataType[value["dtype"]], int(value["bitwidth"]))

    return side(entry["activation"]), side(entry["param"]) if "param" in entry else None


def _allows(kernels: Sequence[tuple[qtype, qtype | None]], candidate: Precision) -> bool:
    return any(act == candidate.activation_type and (param is None or param == candidate.param_type)
               for act, param in kernels)


def _op_types(sim: QuantizationSimModel) -> dict[str, set[str]]:
    """Quantizer name -> the op types it belongs to (module docstring)."""
    producer: dict[str, str] = {}
    readers: dict[str, set[str]] = {}
    for node in sim.model.graph.node:
        for t in node.output:
            producer[t] = node.op_type
        for t in node.input:
            readers.setdefault(t, set()).add(node.op_type)
    owners: dict[str, set[str]] = {}
    for q in sim.quantizers:
        found: set[str] = set()
        for t in q.tensors:
            found |= {producer[t]} if q.role != "param" and t in producer else readers.get(t, set())
        owners[q.name] = found
    return owners


def supported_candidates(sim: QuantizationSimModel, groups: Sequence[QuantizerGroup],
                         candidates: Sequence[Precision], use_all: bool) -> list[tuple[int, ...]]:
    """Per group, the indices of ``candidates`` it supports, in the given order (module docstring)."""
    everything = tuple(range(len(candidates)))
    config = sim.config
    by_op = {op: [_kernel(k) for k in rule.supported_kernels]
             for op, rule in config.op_types.items() if rule.supported_kernels}
    defaults = [_kernel(k) for k in config.supported_kernels]
    if use_all or (not by_op and not defaults):
        return [everything] * len(groups)
    owners = _op_types(sim)
    allowed = []
    for group in groups:
        keep = []
        for c, candidate in enumerate(candidates):
            ok = True
            for name in group.quantizers:
                listed = [op for op in sorted(owners.get(name, ())) if op in by_op]
                if listed:
                    ok = all(_allows(by_op[op], candidate) for op in listed)
                elif defaults:
                    ok = _allows(defaults, candidate)
                if not ok:
                    break
            if ok:
                keep.append(c)
        if not keep:
            ops = sorted({op for name in group.quantizers for op in owners.get(name, ())})
            raise ConfigError(
                f"config {config.source}: no AMP candidate ({', '.join(p.name for p in candidates)}) is among the "
                f"supported_kernels of quantizer group {', '.join(group.nodes or group.quantizers)} (op types "
                f"{ops}); add a supported candidate, or pass use_all_amp_candidates=True to ignore supported_kernels")
        allowed.append(tuple(keep))
    return allowed


def target_candidates(sim: QuantizationSimModel, controlled: Sequence[Sequence[str]], labels: Sequence[str],
                      requested: Callable[[str, int], qtype | None], allowed: Sequence[tuple[int, ...]],
                      ) -> list[tuple[int, ...]]:
    """``allowed`` narrowed to what the sim's target runs (module docstring): ``controlled[g]`` are the
    quantizers of group ``g`` (``labels[g]`` names it), ``requested(name, c)`` the type candidate ``c``
    gives quantizer ``name``."""
    profile = getattr(sim, "target", None)
    if profile is None:
        return list(allowed)
    narrowed = []
    for g, (names, options) in enumerate(zip(controlled, allowed)):
        objections = {c: sim.target_findings({name: requested(name, c) for name in names}) for c in options}
        keep = tuple(c for c in options if not objections[c])
        if not keep:
            first = next(iter(objections.values()), ["no candidate"])
            raise TargetError(f"AMP: quantizer group {labels[g]} has no candidate its target "
                              f"{profile.name} runs: {first[0]}")
        narrowed.append(keep)
    return narrowed
