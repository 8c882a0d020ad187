"""parser.bin on a real pnnx export of a torch module (needs torch and pnnx)."""

import numpy as np
import pytest
import torch

from parser.bin import PnnxBin
from parser.param import read_param


class WeightsNet(torch.nn.Module):
    """Float32 conv and linear weights, plus int64, bool and float64 constants."""

    def __init__(self):
        super().__init__()
        self.features = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU())
        self.fc = torch.nn.Linear(4, 2)
        self.register_buffer("idx", torch.arange(4, dtype=torch.int64))
        self.register_buffer("mask", torch.tensor([True, False, True]))
        self.register_buffer("scale", torch.rand(2, dtype=torch.float64))

    def forward(self, x):
        y = self.features(x).mean((2, 3)) + self.idx
        return self.fc(y), self.mask, self.scale * 2


@pytest.fixture(scope="session")
def exported(pnnx_export):
    """WeightsNet exported by pnnx: the module and every attribute read through PnnxBin."""
    torch.manual_seed(0)
    net = WeightsNet().eval()
    param, binary = pnnx_export(net, (torch.rand(1, 3, 8, 8),), "weights_net")
    graph = read_param(param)
    with PnnxBin(binary) as weights:
        arrays = {f"{op.name}.{attr.name}": weights.read(f"{op.name}.{attr.name}", attr.shape,
                                                         attr.dtype)
                  for op in graph.operators for attr in op.attrs.values()}
        entries = weights.entries()
    return net, arrays, entries


def test_real_export_every_attribute_has_an_entry(exported):
    _, arrays, entries = exported
    assert sorted(arrays) == sorted(entries)


def test_real_export_float32_weights(exported):
    net, arrays, _ = exported
    for key, tensor in [("features.0.weight", net.features[0].weight),
                        ("features.0.bias", net.features[0].bias),
                        ("fc.weight", net.fc.weight), ("fc.bias", net.fc.bias)]:
        assert arrays[key].dtype == np.float32
        np.testing.assert_array_equal(arrays[key], tensor.detach().numpy())


def test_real_export_int64_and_bool_buffers(exported):
    net, arrays, _ = exported
    np.testing.assert_array_equal(arrays["idx.data"], net.idx.numpy())
    assert arrays["idx.data"].dtype == np.int64
    np.testing.assert_array_equal(arrays["mask.data"], net.mask.numpy())
    assert arrays["mask.data"].dtype == np.bool_


def test_real_export_folded_float64_constant(exported):
    net, arrays, _ = exported
    folded = [a for a in arrays.values() if a.dtype == np.float64]
    assert len(folded) == 1
    np.testing.assert_array_equal(folded[0], (net.scale * 2).numpy())
