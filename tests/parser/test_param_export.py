"""parser.param on a real pnnx export of a torch module (needs torch and pnnx)."""

import pytest
import torch

from parser.param import AttributeInfo, OperandInfo, ParamType, parse_value, read_param


class SmallNet(torch.nn.Module):
    """Conv (in a Sequential, so its name has a dot), an expression, a linear head."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1, bias=False),
                                            torch.nn.ReLU())
        self.head = torch.nn.Linear(8, 4)

    def forward(self, x):
        y = self.features(x)
        y = y * 0.5 + x.mean(1, keepdim=True)
        return self.head(y.mean((2, 3)))


@pytest.fixture(scope="session")
def exported(pnnx_export):
    """SmallNet exported by pnnx with two input sizes (so H and W are dynamic)."""
    torch.manual_seed(0)
    net = SmallNet().eval()
    param, _ = pnnx_export(net, (torch.rand(1, 3, 16, 16),), "small_net", dynamic=True)
    return net, read_param(param)


def operator(graph, op_type):
    return next(op for op in graph.operators if op.type == op_type)


def test_real_export_structure(exported):
    _, graph = exported
    types = [op.type for op in graph.operators]
    assert types[0] == "pnnx.Input" and types[-1] == "pnnx.Output"
    assert {"nn.Conv2d", "nn.ReLU", "pnnx.Expression", "nn.Linear"} <= set(types)
    assert [op.line for op in graph.operators] == list(range(3, 3 + len(types)))
    produced = [name for op in graph.operators for name in op.outputs]
    assert sorted(produced) == sorted(graph.operands)  # every operand has one producer


def test_real_export_dynamic_input_shape(exported):
    _, graph = exported
    source = operator(graph, "pnnx.Input").outputs[0]
    assert graph.operands[source] == OperandInfo(source, (None, 3, None, None), "f32")


def test_real_export_conv_record(exported):
    net, graph = exported
    conv, module = operator(graph, "nn.Conv2d"), net.features[0]
    assert conv.name == "features.0"
    assert conv.params["in_channels"].value == module.in_channels
    assert conv.params["out_channels"].value == module.out_channels
    assert conv.params["kernel_size"] == parse_value("(3,3)")
    assert conv.params["bias"].value is False
    assert conv.attrs["weight"] == AttributeInfo("weight", tuple(module.weight.shape), "f32")
    assert "bias" not in conv.attrs


def test_real_export_linear_and_expression(exported):
    net, graph = exported
    linear = operator(graph, "nn.Linear")
    assert linear.attrs["weight"].shape == tuple(net.head.weight.shape)
    assert linear.attrs["bias"].shape == tuple(net.head.bias.shape)
    assert graph.operands[linear.outputs[0]].shape == (None, 4)
    expression = operator(graph, "pnnx.Expression")
    assert expression.params["expr"].type is ParamType.STRING
    assert "@0" in expression.params["expr"].value
