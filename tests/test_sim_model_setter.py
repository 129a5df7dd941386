"""The sim's model setter and its read-only views of the prepared model."""
from __future__ import annotations

import numpy as np
import pytest
from models import BUILDERS

from quantsim import QuantizationSimModel


def test_model_setter_rebuilds_the_index_and_the_session():
    """``sim.model = edited`` (same graph, new weights) is what the sim runs next; a model without the
    quantized tensors is refused, naming them, and the sim is left as it was."""
    import onnx
    from onnx import numpy_helper

    from quantsim.errors import InvalidArgumentError

    model, feeds = BUILDERS["conv_relu"]()
    sim = QuantizationSimModel(model, progress=False)
    sim.compute_encodings([feeds(0, 2)])
    before = sim.session.run(None, feeds(1, 2))[0]
    version = sim.version
    edited = onnx.ModelProto()
    edited.CopyFrom(sim.model.model)
    weight = next(t for t in edited.graph.initializer if numpy_helper.to_array(t).ndim == 4)
    weight.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(weight), weight.name))
    sim.model = edited
    assert sim.version > version
    assert sim.graph_index.model is sim.prepared_model
    after = sim.session.run(None, feeds(1, 2))[0]
    assert not np.array_equal(before, after)
    other = onnx.ModelProto()
    other.CopyFrom(edited)
    renamed = next(t for t in other.graph.initializer if t.name == weight.name)
    renamed.name = weight.name + "_renamed"
    for node in other.graph.node:
        node.input[:] = [renamed.name if i == weight.name else i for i in node.input]
    with pytest.raises(InvalidArgumentError, match=f"lacks 1 tensors.*{weight.name}"):
        sim.model = other
    np.testing.assert_array_equal(sim.session.run(None, feeds(1, 2))[0], after)
