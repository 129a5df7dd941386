"""The per-op facts table is the one source every layer reads."""
import onnx.defs
from onnx import helper

from quantsim.export.integer import movement
from quantsim.graph import op_facts
from quantsim.graph.op_facts import OP_FACTS, channel_axis_of, facts_of


def test_every_entry_names_a_real_onnx_op():
    for op in OP_FACTS:
        assert onnx.defs.has(op), op


def test_grid_movement_ops_are_grid_preserving_and_weighted_ops_quantize_their_weight():
    assert op_facts.GRID_MOVEMENT_OPS <= op_facts.GRID_PRESERVING
    for op in op_facts.WEIGHTED_OPS:
        assert facts_of(op).param_slots[1] == "weight"
        bias = facts_of(op).bias_slot
        assert bias is None or facts_of(op).param_slots[bias] == "bias"


def test_integer_movement_rules_come_from_the_table():
    assert set(op_facts.UINT8_KERNEL_OPSET) <= set(movement.RULES)
    assert all(movement.RULES[op] is movement.lower_direct for op in op_facts.UINT8_KERNEL_OPSET)
    assert facts_of("Resize").uint8_kernel_opset == 10 and not facts_of("Resize").grid_movement


def test_unknown_ops_have_no_facts():
    assert facts_of("MyCustomOp") == op_facts.OpFacts()


def test_channel_axis_follows_attributes_and_rank():
    conv = helper.make_node("Conv", ["x", "w"], ["y"])
    gemm_t = helper.make_node("Gemm", ["x", "w"], ["y"], transB=1)
    gemm = helper.make_node("Gemm", ["x", "w"], ["y"])
    convt_grouped = helper.make_node("ConvTranspose", ["x", "w"], ["y"], group=2)
    matmul = helper.make_node("MatMul", ["x", "w"], ["y"])
    assert channel_axis_of(conv, 1, (8, 3, 3, 3)) == 0
    assert channel_axis_of(gemm_t, 1, (5, 4)) == 0 and channel_axis_of(gemm, 1, (4, 5)) == 1
    assert channel_axis_of(convt_grouped, 1, (4, 2, 3, 3)) is None
    assert channel_axis_of(matmul, 1, (2, 4, 5)) == 2
    assert channel_axis_of(conv, 2, (8,)) == 0 and channel_axis_of(conv, 1, None) is None
