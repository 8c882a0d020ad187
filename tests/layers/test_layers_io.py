"""pnnx.Input / pnnx.Output pass arrays through; pnnx.Attribute outputs its @data weight."""

import pytest
import torch

from helpers import check_layer, make_layer, rand
from layers import LayerRegisterer
from layers.io import Attribute, Input, Output
from parser.errors import LayerError, ShapeError


@pytest.mark.parametrize("type_name", ["pnnx.Input", "pnnx.Output"])
def test_input_and_output_pass_arrays_through(type_name):
    check_layer(type_name, lambda t: t, [(1, 3, 4, 4)])


def test_attribute_outputs_its_data_read_only():
    # pnnx: `pnnx.Attribute buf 0 1 1 @data=(1,8,1,1)f32` for a buffer used in an expression
    data = rand(1, 8, 1, 1)
    (out,) = check_layer("pnnx.Attribute", lambda: torch.from_numpy(data), [],
                         weights={"data": data})
    assert not out.flags.writeable                   # no in-place layer may change a constant


def test_attribute_errors():
    with pytest.raises(LayerError, match="@data"):
        make_layer("pnnx.Attribute", {}, {})
    layer = make_layer("pnnx.Attribute", {}, {"data": rand(3)})
    with pytest.raises(ShapeError, match="no inputs"):
        layer.infer_shapes([(3,)])


@pytest.mark.parametrize("type_name, layer_class", [
    ("pnnx.Input", Input), ("pnnx.Output", Output), ("pnnx.Attribute", Attribute)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class
