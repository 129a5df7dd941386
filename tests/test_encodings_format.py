"""Encodings file formats 0.6.1 / 1.0.0 / 2.0.0: round trips, AIMET's real files, field sets, errors."""
from __future__ import annotations

import copy
import json
import os

import numpy as np
import pytest

import quantsim
from quantsim.core.numerics import Encoding, aimet_offset, encoding_from_range, fake_quantize, grid_bounds
from quantsim.encodings import (
    SUPPORTED_VERSIONS,
    EncodingFormatError,
    TensorEncoding,
    encodings_from_dict,
    encodings_to_dict,
    read_encodings_file,
    write_json_atomic,
)

# --------------------------------------------------------------------------------------------------
# AIMET 2.42.0 files (reference/aimet_onnx_api.md §5.4)

AIMET_V2 = {
    "encodings": [
        {"axis": 0, "name": "conv.weight", "output_dtype": "int8",
         "y_scale": [0.01816430315375328, 0.015435105189681053, 0.01721492037177086, 0.01330005843192339]},
        {"axis": 0, "name": "conv.bias", "output_dtype": "int32",
         "y_scale": [0.0004736144037451595, 0.00040245355921797454, 0.00044886028626933694,
                     0.00034678453812375665]},
        {"axis": 0, "name": "fc.weight", "output_dtype": "int8",
         "y_scale": [0.0024268256966024637, 0.002947089960798621, 0.0030464231967926025,
                     0.0018920571310445666, 0.0019658904056996107]},
        {"axis": 0, "name": "fc.bias", "output_dtype": "int32",
         "y_scale": [0.0001488135603722185, 0.00018071630620397627, 0.00018680744688026607,
                     0.00011602142330957577, 0.00012054889521095902]},
        {"name": "input", "output_dtype": "uint8", "y_scale": 0.02607391114328422, "y_zero_point": 136},
        {"name": "relu_out", "output_dtype": "uint8", "y_scale": 0.06132025251201555},
        {"name": "output", "output_dtype": "uint8", "y_scale": 0.050103165121639474, "y_zero_point": 137},
        {"name": "flat", "output_dtype": "uint8", "y_scale": 0.06132025251201555},
    ],
    "producer": {"package": "aimet-onnx", "version": "2.42.0"},
    "version": "2.0.0",
}
INPUT_V1 = {"bw": 8, "dtype": "INT", "enc_type": "PER_TENSOR", "is_sym": False, "name": "input",
            "offset": [-136.0], "scale": [0.02607391114328422]}
CONV_W_V1 = {"bw": 8, "dtype": "INT", "enc_type": "PER_CHANNEL", "is_sym": True, "name": "conv.weight",
             "offset": [-128.0] * 4, "scale": AIMET_V2["encodings"][0]["y_scale"]}
QUANTIZER_ARGS = {"activation_bitwidth": 8, "dtype": "int", "is_symmetric": True, "param_bitwidth": 8,
                  "per_channel_quantization": True, "quant_scheme": "min_max"}
AIMET_V1 = {"activation_encodings": [INPUT_V1], "param_encodings": [CONV_W_V1],
            "quantizer_args": QUANTIZER_ARGS, "producer": {"package": "aimet-onnx", "version": "2.42.0"},
            "version": "1.0.0"}
INPUT_V061 = [{"bitwidth": 8, "dtype": "int", "is_symmetric": "False", "max": 3.102795426050822,
               "min": -3.546051915486654, "offset": -136.0, "scale": 0.02607391114328422}]
AIMET_V061 = {"activation_encodings": {"input": INPUT_V061}, "param_encodings": {},
              "quantizer_args": QUANTIZER_ARGS, "version": "0.6.1"}

# --------------------------------------------------------------------------------------------------
# records of every grid kind


def _int32_bias(scales) -> Encoding:
    qmin, qmax = grid_bounds(32, True)
    return Encoding(np.asarray(scales, dtype=np.float64), 0, 32, True, qmin, qmax, True, axis=0)


def _blockwise(shape, axis, block_axis, block_size, bits=4, seed=0) -> TensorEncoding:
    from quantsim.core.numerics import reduce_min_max

    w = np.random.default_rng(seed).normal(size=shape)
    mn, mx = reduce_min_max(w, axis, block_axis, block_size)
    enc = encoding_from_range(mn, mx, bits, symmetric=True, axis=axis, block_axis=block_axis, block_size=block_size)
    return TensorEncoding.from_encoding("blk.weight", enc, "param", shape)


def make_records(version: str) -> list[TensorEncoding]:
    R = TensorEncoding.from_encoding
    recs = [
        R("act.asym", encoding_from_range(-0.3, 1.7, 8, symmetric=False), "activation"),
        R("w.sym_pc", encoding_from_range([-1.0, -0.5, -2.0], [1.0, 0.3, 0.7], 8, symmetric=True, axis=0), "param"),
        R("w.strict", encoding_from_range(-2.0, 1.0, 8, symmetric=True, strict=True), "param"),
        R("w.usym", encoding_from_range(0.2, 2.0, 8, symmetric=True, unsigned_symmetric=True), "param"),
        R("w.int4", encoding_from_range([-1.0, -3.0], [2.0, 0.5], 4, symmetric=True, axis=0), "param"),
        R("act.int16", encoding_from_range(-5.0, 11.0, 16, symmetric=False), "activation"),
        R("act.uint4", encoding_from_range(-1.0, 2.0, 4, symmetric=False), "activation"),
        R("conv.bias", _int32_bias([1.5e-5, 2.25e-6, 3.0e-7]), "param"),
    ]
    if version != "2.0.0":
        recs += [
            R("act.int6", encoding_from_range(-1.0, 3.0, 6, symmetric=False), "activation"),
            R("w.int3_sym", encoding_from_range(-1.0, 2.0, 3, symmetric=True), "param"),
            TensorEncoding.float16("act.fp16", "activation"),
            TensorEncoding.float16("w.fp16", "param"),
        ]
    if version != "0.6.1":
        recs.append(_blockwise((6, 32), 0, 1, 8))
    return recs


def _assert_same_numbers(a: Encoding, b: Encoding) -> None:
    assert a.scale.dtype == b.scale.dtype == np.float64
    assert a.scale.reshape(-1).tobytes() == b.scale.reshape(-1).tobytes()  # bit-for-bit
    assert np.array_equal(a.zero_point.reshape(-1), b.zero_point.reshape(-1))
    assert (a.bits, a.signed, a.qmin, a.qmax) == (b.bits, b.signed, b.qmin, b.qmax)


def _through_text(obj):
    return json.loads(json.dumps(obj, sort_keys=True, indent=4))


@pytest.mark.parametrize("version", ["0.6.1", "1.0.0"])
def test_round_trip_legacy_formats(version):
    recs = make_records(version)
    got_version, back = encodings_from_dict(_through_text(encodings_to_dict(recs, version)))
    assert got_version == version
    by_name = {r.name: r for r in back}
    assert set(by_name) == {r.name for r in recs}
    for rec in recs:
        out = by_name[rec.name]
        assert (out.kind, out.bits, out.is_float) == (rec.kind, rec.bits, rec.is_float)
        if rec.is_float:
            assert out.encoding is None
            continue
        _assert_same_numbers(rec.encoding, out.encoding)
        assert out.encoding.symmetric == rec.encoding.symmetric
        assert out.encoding.block_size == rec.encoding.block_size
        assert out.encoding.axis is None and out.encoding.block_axis is None  # bound later by the sim
        if rec.encoding.block_size is None:
            assert out.encoding.scale.shape == rec.encoding.scale.shape
            assert out.same_as(TensorEncoding.from_encoding(
                rec.name, Encoding(rec.encoding.scale, rec.encoding.zero_point, rec.bits, rec.encoding.signed,
                                   rec.encoding.qmin, rec.encoding.qmax, rec.encoding.symmetric), rec.kind))
        else:
            assert out.encoding.scale.ndim == 1  # PER_BLOCK stays flat, (channel, block) order


def test_round_trip_2_0_0():
    recs = make_records("2.0.0")
    got_version, back = encodings_from_dict(_through_text(encodings_to_dict(recs, "2.0.0")))
    assert got_version == "2.0.0"
    by_name = {r.name: r for r in back}
    for rec in recs:
        out = by_name[rec.name]
        assert out.kind is None and out.bits == rec.bits
        _assert_same_numbers(rec.encoding, out.encoding)
        assert out.encoding.scale.shape == rec.encoding.scale.shape
        assert (out.encoding.axis, out.encoding.block_axis, out.encoding.block_size) == (
            rec.encoding.axis, rec.encoding.block_axis, rec.encoding.block_size)
        # unsigned-symmetric is read back as the same unsigned grid without the flag
        expected_sym = rec.encoding.symmetric and rec.encoding.signed
        assert out.encoding.symmetric == expected_sym
    assert by_name["blk.weight"].shape == (6, 32)
    assert by_name["w.strict"].encoding.qmin == -127 and by_name["w.strict"].encoding.symmetric


@pytest.mark.parametrize("shape,axis,block_axis", [((6, 32), 0, 1), ((32, 6), 1, 0), ((4, 16, 3, 3), 0, 1),
                                                   ((16, 4, 3, 3), 1, 0)])
def test_blockwise_2_0_0_layout(shape, axis, block_axis):
    rec = _blockwise(shape, axis, block_axis, 8, bits=8, seed=3)
    entry = encodings_to_dict([rec], "2.0.0")["encodings"][0]
    blocked = list(shape)
    blocked[block_axis] //= 8
    assert np.asarray(entry["y_scale"]).shape == tuple(blocked)
    assert entry["axis"] == block_axis and entry["block_size"] == 8 and entry["output_dtype"] == "int8"
    [out] = encodings_from_dict({"version": "2.0.0", "encodings": [entry]})[1]
    assert out.encoding.same_as(rec.encoding) and out.shape == shape
    x = np.random.default_rng(1).normal(size=shape).astype(np.float32)
    assert np.array_equal(fake_quantize(x, out.encoding), fake_quantize(x, rec.encoding))


def test_2_0_0_activation_forcing_and_equivalence():
    sym_act = TensorEncoding.from_encoding("a", encoding_from_range(-1.0, 2.0, 8, symmetric=True), "activation")
    strict_act = TensorEncoding.from_encoding(
        "s", encoding_from_range(-1.0, 2.0, 8, symmetric=True, strict=True), None)
    asym_act = TensorEncoding.from_encoding("u", encoding_from_range(-1.0, 2.0, 8, symmetric=False), "activation")
    bias = TensorEncoding.from_encoding("b", _int32_bias(1e-5), None)
    entries = {e["name"]: e for e in encodings_to_dict([sym_act, strict_act, asym_act, bias], "2.0.0")["encodings"]}
    assert entries["a"]["output_dtype"] == "uint8" and entries["a"]["y_zero_point"] == 128
    assert entries["s"]["output_dtype"] == "uint8" and entries["s"]["y_zero_point"] == 127
    assert entries["u"]["output_dtype"] == "uint8" and entries["u"]["y_zero_point"] == 85
    assert entries["b"] == {"name": "b", "output_dtype": "int32", "y_scale": 1e-5}  # never forced
    signed = {e["name"]: e for e in encodings_to_dict([asym_act], "2.0.0", force_activation_as="signed")["encodings"]}
    assert signed["u"]["output_dtype"] == "int8" and signed["u"]["y_zero_point"] == 85 - 128
    x = np.linspace(-3, 3, 1001, dtype=np.float32)
    for data in ({"version": "2.0.0", "encodings": list(entries.values())},
                 {"version": "2.0.0", "encodings": list(signed.values())}):
        for out in encodings_from_dict(data)[1]:
            original = {"a": sym_act, "u": asym_act, "b": bias}.get(out.name)
            if original is not None:
                assert np.array_equal(fake_quantize(x, out.encoding), fake_quantize(x, original.encoding))
    [back] = encodings_from_dict({"version": "2.0.0", "encodings": [signed["u"]]})[1]
    assert back.encoding.signed and back.encoding.zero_point == 85 - 128 and not back.encoding.symmetric


# --------------------------------------------------------------------------------------------------
# AIMET's files


def test_real_2_0_0_example():
    version, recs = encodings_from_dict(copy.deepcopy(AIMET_V2), source="model.encodings")
    assert version == "2.0.0" and [r.name for r in recs] == [e["name"] for e in AIMET_V2["encodings"]]
    by_name = {r.name: r for r in recs}
    assert all(r.kind is None and not r.is_float for r in recs)
    enc = by_name["input"].encoding
    assert enc.scale == 0.02607391114328422 and enc.zero_point == 136 and not enc.signed
    assert aimet_offset(enc) == -136 and (enc.qmin, enc.qmax) == (0, 255)
    w = by_name["conv.weight"].encoding
    assert w.signed and w.symmetric and w.axis == 0 and (w.qmin, w.qmax) == (-128, 127)
    assert w.scale.tolist() == AIMET_V2["encodings"][0]["y_scale"] and np.all(w.zero_point == 0)
    assert np.all(aimet_offset(w) == -128)
    relu = by_name["relu_out"].encoding
    assert relu.zero_point == 0 and not relu.signed and relu.bits == 8
    bias = by_name["conv.bias"]
    assert bias.bits == 32 and bias.encoding.signed and bias.encoding.scale.shape == (4,)
    assert by_name["output"].encoding.zero_point == 137


def test_real_2_0_0_example_rewritten_identically():
    recs = encodings_from_dict(copy.deepcopy(AIMET_V2))[1]
    recs = [TensorEncoding(r.name, "param" if "." in r.name else "activation", r.bits, r.is_float, r.encoding)
            for r in recs]
    out = encodings_to_dict(recs, "2.0.0")
    assert out["encodings"] == AIMET_V2["encodings"]
    assert out["version"] == "2.0.0"


def test_real_1_0_0_and_0_6_1_examples_parse_and_rewrite():
    version, recs = encodings_from_dict(copy.deepcopy(AIMET_V1))
    assert version == "1.0.0"
    by_name = {r.name: r for r in recs}
    assert by_name["input"].kind == "activation" and by_name["input"].encoding.zero_point == 136
    w = by_name["conv.weight"]
    assert w.kind == "param" and w.encoding.signed and w.encoding.symmetric and w.encoding.scale.shape == (4,)
    out = encodings_to_dict(recs, "1.0.0", quantizer_args=QUANTIZER_ARGS)
    assert out["activation_encodings"] == [INPUT_V1] and out["param_encodings"] == [CONV_W_V1]
    assert out["quantizer_args"] == QUANTIZER_ARGS

    version, recs = encodings_from_dict(copy.deepcopy(AIMET_V061))
    assert version == "0.6.1"
    [inp] = recs
    assert inp.kind == "activation" and inp.encoding.scale == 0.02607391114328422
    assert inp.encoding.zero_point == 136 and not inp.encoding.symmetric
    assert encodings_to_dict(recs, "0.6.1")["activation_encodings"] == {"input": INPUT_V061}


def test_0_6_1_strict_max_quirk_and_bool_flags():
    enc = encoding_from_range(-2.0, 1.0, 8, symmetric=True, strict=True)
    [entry] = encodings_to_dict([TensorEncoding.from_encoding("w", enc, "param")], "0.6.1")["param_encodings"]["w"]
    assert entry["offset"] == -127.0 and entry["max"] == entry["scale"] * 128 and entry["is_symmetric"] == "True"
    data = {"version": "0.6.1", "param_encodings": {"w": [dict(entry, is_symmetric=True)]}}
    assert encodings_from_dict(data)[1][0].encoding.same_as(enc)


# --------------------------------------------------------------------------------------------------
# documented field sets


def test_writer_field_sets():
    recs = make_records("1.0.0")
    v061 = encodings_to_dict([r for r in recs if r.encoding is None or r.encoding.block_size is None], "0.6.1",
                             quantizer_args=QUANTIZER_ARGS)
    assert set(v061) == {"activation_encodings", "param_encodings", "quantizer_args", "producer", "version"}
    assert v061["producer"] == {"package": "quantsim", "version": quantsim.__version__}
    assert v061["version"] == "0.6.1" and v061["quantizer_args"] == QUANTIZER_ARGS
    chan = v061["activation_encodings"]["act.asym"][0]
    assert set(chan) == {"bitwidth", "dtype", "is_symmetric", "max", "min", "offset", "scale"}
    assert chan["is_symmetric"] == "False" and chan["dtype"] == "int" and isinstance(chan["offset"], float)
    assert len(v061["param_encodings"]["w.sym_pc"]) == 3
    assert v061["activation_encodings"]["act.fp16"] == [{"bitwidth": 16, "dtype": "float"}]
    assert v061["param_encodings"]["conv.bias"][0]["offset"] == -2147483648.0

    v1 = encodings_to_dict(recs, "1.0.0")
    assert set(v1) == {"activation_encodings", "param_encodings", "quantizer_args", "producer", "version"}
    assert v1["quantizer_args"] == {}
    entries = {e["name"]: e for e in v1["activation_encodings"] + v1["param_encodings"]}
    base = {"name", "dtype", "bw", "enc_type", "is_sym", "scale", "offset"}
    assert set(entries["act.asym"]) == base and entries["act.asym"]["is_sym"] is False
    assert entries["w.sym_pc"]["enc_type"] == "PER_CHANNEL" and entries["w.sym_pc"]["offset"] == [-128.0] * 3
    assert entries["w.strict"]["offset"] == [-127.0] and entries["w.usym"]["offset"] == [0.0]
    blk = entries["blk.weight"]
    assert set(blk) == base | {"block_size"} and blk["enc_type"] == "PER_BLOCK" and len(blk["scale"]) == 24
    assert blk["scale"] == recs[-1].encoding.scale.reshape(-1).tolist()  # (channel, block) order
    assert entries["w.fp16"] == {"name": "w.fp16", "dtype": "FLOAT", "bw": 16, "enc_type": "PER_TENSOR"}
    assert entries["conv.bias"]["bw"] == 32 and entries["conv.bias"]["offset"] == [-2147483648.0] * 3

    recs = make_records("2.0.0") + [r for r in recs if r.is_float]
    v2 = encodings_to_dict(recs, "2.0.0", quantizer_args=QUANTIZER_ARGS)
    assert set(v2) == {"encodings", "producer", "version"}
    entries = {e["name"]: e for e in v2["encodings"]}
    assert "act.fp16" not in entries and "w.fp16" not in entries
    assert entries["w.sym_pc"] == {"name": "w.sym_pc", "output_dtype": "int8", "axis": 0,
                                   "y_scale": recs[1].encoding.scale.tolist()}
    assert entries["w.strict"]["output_dtype"] == "int8" and entries["w.strict"]["y_zero_point"] == -1
    assert entries["w.int4"]["output_dtype"] == "int4" and entries["act.int16"]["output_dtype"] == "uint16"
    assert entries["act.uint4"]["output_dtype"] == "uint4"
    assert set(entries["conv.bias"]) == {"name", "output_dtype", "axis", "y_scale"}


def test_bare_param_encodings_guess():
    version, recs = encodings_from_dict({"w": [{"bitwidth": 8, "dtype": "int", "is_symmetric": "True",
                                                "offset": -128.0, "scale": 0.5}]})
    assert version == "0.6.1" and recs[0].kind == "param" and recs[0].encoding.signed
    version, recs = encodings_from_dict([CONV_W_V1])
    assert version == "1.0.0" and recs[0].kind == "param"
    version, recs = encodings_from_dict(AIMET_V2["encodings"][:1])
    assert version == "2.0.0" and recs[0].kind == "param" and recs[0].encoding.axis == 0


def test_versions_compare_numerically():
    assert encodings_from_dict({"version": "2.0", "encodings": []}) == ("2.0.0", [])
    assert encodings_from_dict({"version": "2.1.0", "encodings": []})[0] == "2.0.0"
    for bad in ("10.0.0", "2.0.1", "0.6.10"):
        with pytest.raises(EncodingFormatError, match=bad.replace(".", r"\.")):
            encodings_from_dict({"version": bad, "encodings": []})
    assert encodings_to_dict([], "1.0")["version"] == "1.0.0"
    assert SUPPORTED_VERSIONS == ("0.6.1", "1.0.0", "2.0.0")


# --------------------------------------------------------------------------------------------------
# malformed input


def _v1(**changes):
    entry = dict(CONV_W_V1, **changes)
    return {"version": "1.0.0", "param_encodings": [{k: v for k, v in entry.items() if v is not None}]}


def _v2(**changes):
    entry = dict(AIMET_V2["encodings"][4], **changes)
    return {"version": "2.0.0", "encodings": [{k: v for k, v in entry.items() if v is not None}]}


def _v061(**changes):
    return {"version": "0.6.1", "activation_encodings": {"input": [dict(INPUT_V061[0], **changes)]}}


BAD_INPUTS = {
    "missing scale": (_v1(scale=None), "conv.weight", "scale"),
    "negative scale": (_v1(scale=[0.1, -0.2, 0.1, 0.1]), "conv.weight", "> 0"),
    "zero scale 2.0.0": (_v2(y_scale=0.0), "input", "> 0"),
    "nan scale 2.0.0": (_v2(y_scale=float("nan")), "input", "finite"),
    "inf scale 0.6.1": (_v061(scale=float("inf")), "input", "finite"),
    "string scale": (_v2(y_scale="0.1"), "input", "y_scale"),
    "zp above uint8": (_v2(y_zero_point=256), "input", "range"),
    "zp below int8": (_v2(output_dtype="int8", y_zero_point=-129), "input", "range"),
    "fractional zp": (_v2(y_zero_point=3.5), "input", "whole"),
    "offset too big": (_v1(is_sym=False, offset=[-300.0] * 4), "conv.weight", "offset"),
    "fractional offset": (_v1(offset=[-127.5] * 4), "conv.weight", "whole"),
    "unknown enc_type": (_v1(enc_type="PER_GROUP"), "conv.weight", "PER_GROUP"),
    "lpbq": (_v1(enc_type="LPBQ"), "conv.weight", "compressed_bw"),  # an LPBQ entry needs its fields
    "is_sym string in 1.0.0": (_v1(is_sym="True"), "conv.weight", "is_sym"),
    "bad is_symmetric 0.6.1": (_v061(is_symmetric="yes"), "input", "is_symmetric"),
    "bad bitwidth": (_v1(bw=17), "conv.weight", "17"),
    "offset count": (_v1(offset=[-128.0]), "conv.weight", "offset"),
    "per-tensor with two scales": (_v1(enc_type="PER_TENSOR"), "conv.weight", "PER_TENSOR"),
    "block_size without axis": (_v2(block_size=16), "input", "requires 'axis'"),
    "bw in 2.0.0": (_v2(bw=8), "input", "bw"),
    "fp8 fnuz dtype": (_v2(output_dtype="float8e4m3fnuz"), "input", "float8e4m3fnuz"),
    "fp8 zero point": (_v2(output_dtype="float8e4m3fn", y_zero_point=3), "input", "y_zero_point"),
    "fp8 blockwise": (_v2(output_dtype="float8e5m2", axis=0, block_size=2), "input", "blockwise"),
    "unknown version": ({"version": "3.0.0", "encodings": []}, None, "3.0.0"),
    "missing version": ({"encodings": []}, None, "version"),
    "duplicate 2.0.0": ({"version": "2.0.0", "encodings": AIMET_V2["encodings"][4:6] * 2}, "input", "duplicate"),
    "duplicate across sections": ({"version": "1.0.0", "param_encodings": [CONV_W_V1],
                                   "activation_encodings": [dict(INPUT_V1, name="conv.weight")]},
                                  "conv.weight", "duplicate"),
    "wrong section for 1.0.0": ({"version": "1.0.0", "encodings": []}, None, "encodings"),
    "missing name": ({"version": "1.0.0", "param_encodings": [{"dtype": "INT"}]}, "param_encodings[0]", "name"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_malformed_inputs_name_file_and_entry(case):
    data, entry, problem = BAD_INPUTS[case]
    with pytest.raises(EncodingFormatError) as info:
        encodings_from_dict(copy.deepcopy(data), source="bad/model.encodings")
    message = str(info.value)
    assert message.startswith("bad/model.encodings")
    assert problem in message
    if entry is not None:
        assert entry in message


def test_file_errors_name_the_path(tmp_path):
    path = tmp_path / "broken.encodings"
    path.write_text('{"version": "1.0.0", "param_encodings": [')
    with pytest.raises(EncodingFormatError, match="broken.encodings.*not valid JSON"):
        read_encodings_file(path)
    path.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(EncodingFormatError, match="broken.encodings"):
        read_encodings_file(str(path))
    path.write_text('{"version": "0.6.1", "param_encodings": {"w": [], "w": []}}')
    with pytest.raises(EncodingFormatError, match="broken.encodings.*'w'.*duplicate"):
        read_encodings_file(path)
    path.write_text(json.dumps({"version": "3.0.0", "encodings": []}))
    with pytest.raises(EncodingFormatError, match=r"broken\.encodings.*3\.0\.0"):
        read_encodings_file(path)


def test_writer_errors_name_the_tensor():
    blk = _blockwise((6, 32), 0, 1, 8)
    with pytest.raises(EncodingFormatError, match="blk.weight.*0.6.1"):
        encodings_to_dict([blk], "0.6.1")
    with pytest.raises(EncodingFormatError, match="blk.weight.*shape"):
        encodings_to_dict([TensorEncoding.from_encoding("blk.weight", blk.encoding, "param")], "2.0.0")
    int6 = TensorEncoding.from_encoding("act6", encoding_from_range(-1.0, 1.0, 6, symmetric=False), "activation")
    with pytest.raises(EncodingFormatError, match="act6.*6-bit"):
        encodings_to_dict([int6], "2.0.0")
    no_axis = TensorEncoding.from_encoding("pc", encoding_from_range([-1.0, -2.0], [1.0, 2.0], 8, symmetric=True),
                                           "param")
    with pytest.raises(EncodingFormatError, match="pc.*axis"):
        encodings_to_dict([no_axis], "2.0.0")
    with pytest.raises(EncodingFormatError, match="duplicate"):
        encodings_to_dict([int6, int6], "1.0.0")
    with pytest.raises(EncodingFormatError, match="3.0.0"):
        encodings_to_dict([int6], "3.0.0")
    with pytest.raises(ValueError, match="force_activation_as"):
        encodings_to_dict([int6], "2.0.0", force_activation_as="int")


# --------------------------------------------------------------------------------------------------
# files


def test_write_and_read_file(tmp_path):
    path = tmp_path / "model.encodings"
    for version in SUPPORTED_VERSIONS:
        data = encodings_to_dict(make_records(version), version)
        write_json_atomic(path, data)
        assert path.read_text() == json.dumps(data, sort_keys=True, indent=4)
        got_version, recs = read_encodings_file(path)
        assert got_version == version and len(recs) == len(data.get("encodings", make_records(version)))
    assert os.listdir(tmp_path) == ["model.encodings"]


def test_write_json_atomic_failure_keeps_old_file(tmp_path, monkeypatch):
    path = tmp_path / "model.encodings"
    write_json_atomic(path, {"version": "1.0.0"})
    old = path.read_text()
    with pytest.raises(TypeError):
        write_json_atomic(path, {"version": "1.0.0", "bad": {1, 2}})
    assert path.read_text() == old and os.listdir(tmp_path) == ["model.encodings"]

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        write_json_atomic(path, {"version": "2.0.0"})
    assert path.read_text() == old and os.listdir(tmp_path) == ["model.encodings"]
