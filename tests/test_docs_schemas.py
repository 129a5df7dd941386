"""The JSON Schemas in docs/schemas describe what quantsim ships and writes (and reject what it refuses)."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
from tiny_cnn import batches, calibrated_sim, make_model  # tests/tiny_cnn.py

from quantsim import ConfigError, QuantizationSimModel

jsonschema = pytest.importorskip("jsonschema")
from referencing import Registry, Resource  # noqa: E402 (comes with jsonschema)

SCHEMAS = Path(__file__).resolve().parent.parent / "docs" / "schemas"


def _registry() -> Registry:
    resources = []
    for path in SCHEMAS.glob("*.schema.json"):
        schema = json.loads(path.read_text())
        resources.append((path.name, Resource.from_contents(schema)))
        resources.append((schema["$id"], Resource.from_contents(schema)))
    return Registry().with_resources(resources)


REGISTRY = _registry()


def validator(name: str):
    schema = json.loads((SCHEMAS / name).read_text())
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, registry=REGISTRY)


def _sims():
    """Sims covering what the writers emit: per-tensor, per-channel, blockwise, LPBQ, int4/int16, float16."""
    per_channel = calibrated_sim()
    per_tensor = calibrated_sim(config_file="per_tensor")
    mixed = calibrated_sim()
    mixed.qc_quantize_op_dict["W"].set_bitwidth(4)
    mixed.qc_quantize_op_dict["r"].set_precision("float16")
    mixed.qc_quantize_op_dict["y"].set_bitwidth(16)
    mixed.compute_encodings(batches())
    blockwise = QuantizationSimModel(make_model(channels=4), progress=False)
    from quantsim import PerBlock

    q = blockwise.qc_quantize_op_dict["W2"]
    q.set_qspec(q.spec.with_(granularity=PerBlock(0, 1, 2)))
    blockwise.compute_encodings(batches())
    from quantsim import QSpec

    lpbq = QuantizationSimModel(make_model(channels=4), progress=False)
    lpbq.qc_quantize_op_dict["W2"].set_qspec(QSpec.lpbq("int4", block_size=2))
    lpbq.compute_encodings(batches())
    return {"per_channel": per_channel, "per_tensor": per_tensor, "mixed": mixed, "blockwise": blockwise, "lpbq": lpbq}


SIMS = _sims()


@pytest.mark.parametrize("version", ["0.6.1", "1.0.0", "2.0.0"])
@pytest.mark.parametrize("which", sorted(SIMS))
def test_exported_encodings_match_their_schema(tmp_path, version, which):
    sim = SIMS[which]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            sim.export(str(tmp_path), "m", export_model=False, encoding_version=version,
                       requant_table=which == "per_channel")
        except Exception as error:  # noqa: BLE001 - a version that cannot carry this sim says so
            pytest.skip(f"{version} cannot carry the {which} sim: {error}")
    document = json.loads((tmp_path / "m.encodings").read_text())
    validator(f"encodings-{version}.schema.json").validate(document)


@pytest.mark.parametrize("name", ["default_config.json", "default_config_per_channel.json"])
def test_shipped_configs_match_the_config_schema(name):
    from quantsim.sim.config import CONFIG_DIR

    validator("quantsim-config.schema.json").validate(json.loads((CONFIG_DIR / name).read_text()))


def test_the_config_schema_rejects_what_the_parser_rejects():
    from quantsim.sim.config import CONFIG_DIR, load_config

    check = validator("quantsim-config.schema.json")
    good = json.loads((CONFIG_DIR / "default_config.json").read_text())
    bad_documents = []
    for key, value in (("unknown_top_level", {}), ("defaults", {"ops": {}}), ("supergroups", [{"op_list": ["Conv"]}])):
        bad = json.loads(json.dumps(good))
        bad[key] = value
        bad_documents.append(bad)
    for bad in bad_documents:
        assert not check.is_valid(bad)
        with pytest.raises(ConfigError):
            load_config(bad)


@pytest.mark.parametrize("integer_io", [False, True])
def test_integer_export_requant_table_matches_its_schema(tmp_path, integer_io):
    integer = SIMS["per_channel"].export_integer(integer_io=integer_io)
    _, table = integer.save(tmp_path / "int")
    document = json.loads(table.read_text())
    validator("requant.schema.json").validate(document)
    assert bool(document["io"]) == integer_io


def test_precision_override_files_match_their_schema(tmp_path):
    from mixed_precision import load_overrides
    from mixed_precision.presets import PRESETS

    check = validator("precision-overrides.schema.json")
    document = {"default": "W8A8", "op_type": {"Gemm": "W8A16"}, "regex": {"^conv": "W4A8"}, "node": {"relu": "FP16"}}
    check.validate(document)
    load_overrides(document)
    assert set(json.loads((SCHEMAS / "precision-overrides.schema.json").read_text())["$defs"]["preset"]["enum"]) \
        == set(PRESETS)  # the schema lists exactly the presets the package has
    assert not check.is_valid({"default": "W3A3"}) and not check.is_valid({"nodes": {}})


def test_schemas_reject_malformed_encodings():
    one = validator("encodings-1.0.0.schema.json")
    entry = {"name": "x", "dtype": "INT", "bw": 8, "enc_type": "PER_TENSOR", "is_sym": False, "scale": [0.1],
             "offset": [-128.0]}
    one.validate({"version": "1.0.0", "activation_encodings": [entry], "param_encodings": []})
    for broken in ({**entry, "scale": [0.0]}, {**entry, "bw": 1}, {**entry, "enc_type": "PER_BLOCK"},
                   {k: v for k, v in entry.items() if k != "name"}):
        assert not one.is_valid({"version": "1.0.0", "activation_encodings": [broken], "param_encodings": []})
    two = validator("encodings-2.0.0.schema.json")
    assert not two.is_valid({"version": "2.0.0", "encodings": [{"name": "x", "output_dtype": "int3", "y_scale": 1.0}]})
    assert np.isfinite(1.0)
