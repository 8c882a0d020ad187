"""Layer parameters declared as ``Param`` class attributes (layers/base.py): PARAMS collected
through subclasses, defaults and converters, required parameters, the dict form, and reading a
parameter before load_param."""

from __future__ import annotations

import pytest

from layers.base import Layer, Param, as_bool, as_float, as_int, as_tuple, at_least
from parser.errors import LayerError


class Window(Layer):
    kernel_size = Param(convert=at_least(1, as_tuple(2)))        # required
    stride = Param(1, at_least(1, as_tuple(2)))
    ceil_mode = Param(False, as_bool)
    padding = Param(0, as_tuple(2))


class Pool(Window):
    stride = Param(None, as_tuple(2))                            # overridden in place
    return_indices = Param(False, as_bool)


class Unpadded(Pool):
    padding = (0, 0)                                             # a constant, no parameter


class Scale(Layer):
    PARAMS = {"factor": Param(2.0, as_float)}                    # the dict form


class ScaleMore(Scale):
    offset = Param(0.0, as_float)


def test_params_are_collected_through_subclasses_base_first():
    assert list(Window.PARAMS) == ["kernel_size", "stride", "ceil_mode", "padding"]
    assert list(Pool.PARAMS) == ["kernel_size", "stride", "ceil_mode", "padding",
                                 "return_indices"]
    assert Pool.PARAMS["stride"] is vars(Pool)["stride"]
    assert Window.PARAMS["stride"].default == 1
    assert list(Unpadded.PARAMS) == ["kernel_size", "stride", "ceil_mode", "return_indices"]


def test_the_class_attribute_is_the_declaration():
    assert isinstance(Pool.stride, Param)
    assert Pool.stride.name == "stride" and Pool.stride.default is None


def test_defaults_and_converters_apply():
    layer = Pool(kernel_size=3, ceil_mode=True)
    assert layer.kernel_size == (3, 3)
    assert layer.stride is None                                  # None is never converted
    assert layer.padding == (0, 0)                               # a default is converted
    assert (layer.ceil_mode, layer.return_indices) == (True, False)
    assert Window(kernel_size=(2, 3), stride=2).stride == (2, 2)
    assert Unpadded(kernel_size=2).padding == (0, 0)
    assert "kernel_size=(3, 3)" in repr(layer)


def test_a_missing_required_parameter_is_a_layer_error():
    layer = Pool()                                               # configured later by a graph
    with pytest.raises(LayerError, match="missing parameter 'kernel_size'"):
        layer.load_param({"stride": 2})


def test_a_bad_value_is_a_layer_error_naming_the_parameter():
    with pytest.raises(LayerError, match="kernel_size=0"):
        Pool(kernel_size=0)


def test_reading_a_parameter_before_load_param_names_it():
    layer = Pool()
    with pytest.raises(AttributeError, match="'kernel_size'.*load_param"):
        _ = layer.kernel_size
    assert getattr(layer, "stride", "absent") == "absent"
    assert "kernel_size=None" in repr(layer)


def test_the_dict_form_still_works():
    assert list(Scale.PARAMS) == ["factor"]
    assert Scale().factor == 2.0 and Scale(factor=3).factor == 3.0
    assert list(ScaleMore.PARAMS) == ["factor", "offset"]
    layer = ScaleMore(offset=1)
    assert (layer.factor, layer.offset) == (2.0, 1.0)


def test_a_dict_form_subclass_lists_all_its_parameters():
    class OnlyCount(Pool):
        PARAMS = {"count": Param(1, as_int)}

    assert list(OnlyCount.PARAMS) == ["count"]
    assert OnlyCount().count == 1
