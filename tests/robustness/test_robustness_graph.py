"""Bad graphs and bad operator parameters: each is one GraphError / UnsupportedOperatorError /
LayerError / ShapeError at build time, naming the operator (and the file line where the
graph's structure is at fault), never a crash at run time."""

from __future__ import annotations

import numpy as np
import pytest

from infer import (GraphError, LayerError, RuntimeGraph, ShapeError,
                   UnsupportedOperatorError)
from support import conv_line, conv_weights, expect_error, write_model

INPUT = "pnnx.Input in0 0 1 0 #0=(1,3,8,8)f32"


def build(tmp_path, *lines, weights=None) -> RuntimeGraph:
    return RuntimeGraph(*write_model(tmp_path, *lines, weights=weights)).build()


def expect_build_error(kind, tmp_path, *lines, words=(), weights=None):
    return expect_error(kind, lambda: build(tmp_path, *lines, weights=weights), *words)


# ----- structure --------------------------------------------------------------------------------

def test_cycle(tmp_path):
    error = expect_build_error(
        GraphError, tmp_path, INPUT,
        "torch.cat cat 2 1 0 3 1 dim=1",          # reads 3, which depends on cat itself
        "nn.ReLU relu 1 1 1 2",
        "nn.Sigmoid sig 1 1 2 3",
        "pnnx.Output out0 1 0 1",
        words=("model.pnnx.param:", "cycle"))
    assert error.operator in ("torch.cat cat", "nn.ReLU relu", "nn.Sigmoid sig")


def test_operator_feeding_itself(tmp_path):
    expect_build_error(GraphError, tmp_path, INPUT, "torch.cat cat 2 1 0 1 1 dim=1",
                       "pnnx.Output out0 1 0 1", words=("model.pnnx.param:4", "cycle"))


def test_output_that_no_input_reaches(tmp_path):
    """Operators that only feed each other: nothing from an input ever gets there."""
    error = expect_build_error(
        GraphError, tmp_path, INPUT,
        "nn.ReLU relu 1 1 2 1", "nn.Sigmoid sig 1 1 1 2",
        "pnnx.Output out0 2 0 0 2",
        words=("cannot be reached from any input",))
    assert error.operator in ("nn.ReLU relu", "nn.Sigmoid sig")


def test_output_of_an_operand_nobody_produces(tmp_path):
    error = expect_build_error(GraphError, tmp_path, INPUT, "pnnx.Output out0 1 0 7",
                               words=("model.pnnx.param:4", "operand '7'", "no operator"))
    assert error.operator == "pnnx.Output out0"


def test_output_from_a_constant_alone_is_that_constant(tmp_path):
    """An output computed from the model's constants without the input is allowed, as in
    torch (a model may return a buffer); it comes out as the constant, writeable."""
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    graph = build(tmp_path, INPUT, "pnnx.Attribute const 0 1 1 @data=(2,3)f32",
                  "nn.ReLU relu 1 1 0 2", "pnnx.Output out0 2 0 2 1",
                  weights={"const.data": data})
    x = np.ones((1, 3, 8, 8), np.float32)
    relu, constant = graph.forward(x)
    np.testing.assert_array_equal(constant, data)
    assert constant.flags.writeable


def test_unknown_operator_type(tmp_path):
    error = expect_build_error(
        UnsupportedOperatorError, tmp_path, INPUT, "nn.Relu relu 1 1 0 1",
        "nn.Frobnicate frob 1 1 1 2", "pnnx.Output out0 1 0 2",
        words=("model.pnnx.param:4", "'nn.Relu'", "nn.ReLU", "nn.Frobnicate"))
    assert error.operator == "nn.Relu relu"


def test_operator_without_the_inputs_it_needs(tmp_path):
    expect_build_error(ShapeError, tmp_path, INPUT, "nn.ReLU relu 0 1 1",
                       "pnnx.Output out0 1 0 1", words=("nn.ReLU relu", "expects 1 input, got 0"))


def test_operator_with_too_many_outputs(tmp_path):
    expect_build_error(LayerError, tmp_path, INPUT, "nn.ReLU relu 1 2 0 1 2",
                       "pnnx.Output out0 2 0 1 2", words=("nn.ReLU relu", "1 output shapes",
                                                          "2 outputs"))


# ----- parameters a layer cannot accept ---------------------------------------------------------

CONV_CASES = [
    ({"stride": "(-1,1)"}, "stride=(-1, 1): every value must be >= 1"),
    ({"stride": "(0,0)"}, "every value must be >= 1"),
    ({"kernel_size": "(0,3)"}, "kernel_size=(0, 3): every value must be >= 1"),
    ({"padding": "(-1,0)"}, "padding=(-1, 0): every value must be >= 0"),
    ({"dilation": "(1,0)"}, "dilation=(1, 0): every value must be >= 1"),
    ({"groups": "2"}, "in_channels=3 is not divisible by groups=2"),
    ({"groups": "0"}, "groups=0: every value must be >= 1"),
    ({"groups": "-3"}, "groups=-3"),
    ({"in_channels": "3.5"}, "in_channels=3.5: expected an integer"),
    ({"kernel_size": "(3,3,3)"}, "expected 2 integers, got 3"),
    ({"kernel_size": "big"}, "kernel_size='big'"),
    ({"padding": "around"}, "'same' or 'valid'"),
    ({"padding": "same", "stride": "(2,2)"}, "padding='same'"),
    ({"padding_mode": "mirror"}, "padding_mode must be"),
    ({"bias": "False"}, "bias=False but a @bias weight"),
    ({"bias": "maybe"}, "bias='maybe': expected True or False"),
    ({"in_channels": "5"}, "@weight has shape (4, 3, 3, 3), expected (4, 5, 3, 3)"),
]


@pytest.mark.parametrize("changes, words", CONV_CASES,
                         ids=[",".join(c) + "=" + ",".join(c.values()) for c, _ in CONV_CASES])
def test_convolution_parameters_it_cannot_accept(tmp_path, changes, words):
    error = expect_build_error(LayerError, tmp_path, INPUT, conv_line(**changes),
                               "pnnx.Output out0 1 0 1", weights=conv_weights(), words=(words,))
    assert error.operator == "nn.Conv2d conv"


def test_missing_required_parameter(tmp_path):
    line = conv_line().replace("in_channels=3 ", "")
    expect_build_error(LayerError, tmp_path, INPUT, line, "pnnx.Output out0 1 0 1",
                       weights=conv_weights(), words=("nn.Conv2d conv",
                                                      "missing parameter 'in_channels'"))


def test_missing_weight(tmp_path):
    line = conv_line().replace(" @weight=(4,3,3,3)f32", "")
    expect_build_error(LayerError, tmp_path, INPUT, line, "pnnx.Output out0 1 0 1",
                       weights=conv_weights(), words=("nn.Conv2d conv", "missing weight @weight"))


POOL = ("nn.MaxPool2d pool 1 1 0 1 ceil_mode=False dilation=(1,1) kernel_size={k} "
        "padding={p} return_indices=False stride={s}")
LAYER_CASES = [
    (POOL.format(k="(0,2)", p="(0,0)", s="(2,2)"), LayerError, "kernel_size=(0, 2)"),
    (POOL.format(k="(2,2)", p="(0,0)", s="(-2,2)"), LayerError, "stride=(-2, 2)"),
    (POOL.format(k="(2,2)", p="(2,2)", s="(2,2)"), LayerError, "at most half of the kernel"),
    (POOL.format(k="(2,2)", p="(0,0)", s="(2,2)").replace("False", "True", 2), LayerError,
     "computes 2 output shapes for 1 outputs"),          # indices asked for, no operand
    (POOL.format(k="(9,9)", p="(0,0)", s="(1,1)"), ShapeError, "smaller than the 9x9 window"),
    ("nn.AvgPool2d pool 1 1 0 1 kernel_size=(2,2) divisor_override=0", LayerError,
     "divisor_override=0"),
    ("nn.Softmax softmax 1 1 0 1 dim=4", ShapeError, "dim 4 is out of range"),
    ("nn.Softmax softmax 1 1 0 1 dim=(1,2)", LayerError, "dim=(1, 2)"),
    ("torch.flatten flatten 1 1 0 1 start_dim=2 end_dim=-5", ShapeError, "out of range"),
    ("Tensor.view view 1 1 0 1 shape=(5,7)", ShapeError, "cannot reshape"),
    ("Tensor.reshape view 1 1 0 1 shape=(-1,-1)", ShapeError, "only one dim may be -1"),
    ("nn.LeakyReLU leaky 1 1 0 1 negative_slope=fast", LayerError, "negative_slope='fast'"),
    ("nn.ZeroPad2d pad 1 1 0 1 padding=(1,2,3)", LayerError, "padding"),
    ("nn.AdaptiveAvgPool2d pool 1 1 0 1 output_size=(1,2,3)", LayerError, "output_size"),
]


@pytest.mark.parametrize("line, kind, words", LAYER_CASES,
                         ids=[f"{line.split()[0]}:{words}" for line, _, words in LAYER_CASES])
def test_layer_parameters_it_cannot_accept(tmp_path, line, kind, words):
    op = " ".join(line.split()[:2])
    error = expect_build_error(kind, tmp_path, INPUT, line, "pnnx.Output out0 1 0 1",
                               words=(words,))
    assert error.operator == op and str(error).startswith(f"operator {op} (line 4): ")


def test_linear_weight_that_disagrees_with_its_features(tmp_path):
    weights = {"fc.weight": np.zeros((4, 8), np.float32)}
    expect_build_error(
        LayerError, tmp_path, "pnnx.Input in0 0 1 0 #0=(2,8)f32",
        "nn.Linear fc 1 1 0 1 bias=False in_features=6 out_features=4 @weight=(4,8)f32",
        "pnnx.Output out0 1 0 1", weights=weights,
        words=("nn.Linear fc", "@weight has shape (4, 8), expected (4, 6)"))


def test_channels_that_disagree_between_operators(tmp_path):
    """The convolution takes 3 channels; the input line says 5: refused at build, naming
    the convolution."""
    expect_build_error(ShapeError, tmp_path, INPUT.replace("(1,3,8,8)", "(1,5,8,8)"),
                       conv_line(), "pnnx.Output out0 1 0 1", weights=conv_weights(),
                       words=("nn.Conv2d conv",))
