"""AdaRound's ``executor=``: each layer draws from its own generator (`adaround.layer_job.layer_seed`), so
independent layers optimised at once on threads, processes or a Dask cluster give the local run's rounded
weights and reports bit for bit, in both call forms."""
import multiprocessing
import warnings
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from adaround import Adaround, AdaroundParameters, apply_adaround
from adaround.levels import independent_levels
from quantsim import QuantizationSimModel

ITERATIONS = 60


def _model() -> onnx.ModelProto:
    """Two conv branches (one with an unfolded BatchNormalization, both followed by Relu: sampled columns), added;
    then a 1x1 Conv (exact moments) and a 384-wide MatMul (moments plus anchored samples) read the sum."""
    rng = np.random.default_rng(5)

    def init(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(np.prod(shape[:-1] if len(shape) == 2
                                                                                    else shape[1:]))).astype(np.float32),
                                       name)

    def const(name, values):
        return numpy_helper.from_array(np.asarray(values, np.float32), name)

    nodes = [helper.make_node("Conv", ["x", "wa", "ba"], ["a"], name="conv_a", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["a"], ["ar"], name="relu_a"),
             helper.make_node("Conv", ["x", "wb"], ["b"], name="conv_b", pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["b", "g", "beta", "mean", "var"], ["bn"], name="bn_b"),
             helper.make_node("Relu", ["bn"], ["br"], name="relu_b"),
             helper.make_node("Add", ["ar", "br"], ["s"], name="add"),
             helper.make_node("Conv", ["s", "wc"], ["y1"], name="conv_c"),
             helper.make_node("Flatten", ["s"], ["f"], name="flatten"),
             helper.make_node("MatMul", ["f", "wm"], ["y2"], name="matmul")]
    inits = [init("wa", 6, 3, 3, 3), const("ba", rng.standard_normal(6) * 0.1), init("wb", 6, 3, 3, 3),
             const("g", rng.uniform(0.5, 2.0, 6)), const("beta", rng.standard_normal(6) * 0.1),
             const("mean", rng.standard_normal(6) * 0.1), const("var", rng.uniform(0.5, 1.5, 6)),
             init("wc", 4, 6, 1, 1), init("wm", 384, 10)]
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 8, 8])],
                              [helper.make_tensor_value_info("y1", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("y2", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _feeds(count=3):
    return [{"x": np.random.default_rng(s).standard_normal((4, 3, 8, 8)).astype(np.float32)} for s in range(count)]


def _sim():
    sim = QuantizationSimModel(_model(), param_type="int4", activation_type="int8", fold_batchnorm=False,
                               progress=False)
    sim.compute_encodings(_feeds())
    return sim


def _weights(sim):
    return {layer.weight: sim.get_weight(layer.weight).copy() for layer in sim.weighted_layers()}


def _run(executor=None, **kwargs):
    sim = _sim()
    kwargs = {"columns_per_iteration": 64, "quadratic_columns_per_iteration": 4, **kwargs}  # random windows
    reports = apply_adaround(sim, _feeds(), num_iterations=ITERATIONS, executor=executor, **kwargs)
    return _weights(sim), [(r.node, r.status, r.mode, r.loss_before, r.loss_after, r.flipped, r.iterations)
                          for r in reports]


def _assert_same(local, remote):
    assert local[0].keys() == remote[0].keys()
    for name in local[0]:
        np.testing.assert_array_equal(local[0][name], remote[0][name], err_msg=name)
    assert local[1] == remote[1]


def test_the_model_has_independent_layers_in_every_mode():
    sim = _sim()
    assert [[layer.node for layer in level] for level in independent_levels(sim, sim.weighted_layers())] == \
        [["conv_a", "conv_b"], ["conv_c", "matmul"]]
    assert sim.weighted_layers()[1].batchnorm is not None  # conv_b's BatchNormalization stays unfolded
    modes = {node: mode for node, _, mode, *_ in _run()[1]}
    assert modes == {"conv_a": "sampled", "conv_b": "sampled", "conv_c": "moments", "matmul": "moments+sampled"}


@pytest.mark.parametrize("pool", [ThreadPoolExecutor, ProcessPoolExecutor])
def test_an_executor_gives_the_local_result_bit_for_bit(pool):
    local = _run()
    # processes are spawned: a fork of this process, whose onnxruntime sessions hold threads, can hang
    options = {"mp_context": multiprocessing.get_context("spawn")} if pool is ProcessPoolExecutor else {}
    with pool(2, **options) as executor:
        remote = _run(executor)
    _assert_same(local, remote)
    assert all(status == "rounded" for _, status, *_ in local[1])
    assert any(flipped for *_, flipped, _ in local[1])  # the optimisation did move weights off nearest
    assert all(steps == ITERATIONS for *_, steps in local[1])  # too few steps for any layer to settle


def test_a_dask_cluster_gives_the_local_result_bit_for_bit():
    distributed = pytest.importorskip("distributed")
    local = _run()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # dask's own deprecation and port warnings
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                      dashboard_address=None) as cluster, distributed.Client(cluster) as client:
            remote = _run(client.get_executor())
    _assert_same(local, remote)


def test_a_layer_draws_from_its_own_generator():
    """conv_b's input is the model input: rounded alone, it gets the weight it gets in the whole run (with one
    generator for the run it would draw what conv_a left)."""
    whole, alone = _run(), _run(nodes_to_include=["conv_b"])
    np.testing.assert_array_equal(whole[0]["wb"], alone[0]["wb"])
    other_seed = _run(seed=1)
    assert any(not np.array_equal(whole[0][name], other_seed[0][name]) for name in whole[0])


def test_the_older_form_takes_an_executor(tmp_path):
    def run(executor=None):
        params = AdaroundParameters(_feeds(), 3, default_num_iterations=ITERATIONS)
        model = Adaround.apply_adaround(_model(), params, str(tmp_path), "ada", executor=executor)
        return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}

    local = run()
    with ThreadPoolExecutor(2) as executor:
        remote = run(executor)
    assert local.keys() == remote.keys()
    for name in local:
        np.testing.assert_array_equal(local[name], remote[name], err_msg=name)
