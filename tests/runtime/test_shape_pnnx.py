"""Shape and data-movement operators through pnnx: tiny modules exported with pnnx (static and
dynamic), run by RuntimeGraph and compared with torch. This checks that the layers serve the
type names and parameters pnnx really writes, and that shape arithmetic computed in the graph
(``x.view(x.size(0), -1)``, ``x[:, :x.size(1) // 2]``) is planned and run at new sizes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_graph_against_torch
from infer import RuntimeGraph


def run_both(module: nn.Module, graph: RuntimeGraph, *shapes: tuple[int, ...]) -> None:
    """Same random inputs to torch and to the graph; every output must agree in shape and
    value."""
    check_graph_against_torch(module, graph, *shapes, atol=1e-5, rtol=1e-5)


def exported(pnnx_export, module, shapes, name, **options):
    module = module.eval()
    param, binary = pnnx_export(module, tuple(torch.rand(*s) for s in shapes), name, **options)
    return module, RuntimeGraph(param, binary).build(), param.read_text()


class Reorder(nn.Module):
    def forward(self, x, y):                                   # (2, 3, 10), (6, 10)
        return (x.view(2, -1), x.reshape(-1, 4), x.view_as(y), x.reshape_as(y),
                torch.flatten(x, -2), x.permute(2, 0, 1), x.transpose(0, 2), x.mT,
                x.unsqueeze(-1), x[:, :1].squeeze(1), x[:1].squeeze(), x.unflatten(2, (2, -1)),
                x[:, :1].expand(-1, 4, -1), x[:, :1].expand(3, 2, 3, 10), x.repeat(1, 2, 1),
                torch.tile(x, (2,)), torch.flip(x, [1, -1]), torch.roll(x, (1, -2), (0, 2)),
                torch.roll(x, 3))


def test_reordering_operators_round_trip(pnnx_export):
    module, graph, text = exported(pnnx_export, Reorder(), [(2, 3, 10), (6, 10)], "reorder")
    for op in ("Tensor.reshape", "aten::view_as", "Tensor.reshape_as", "Tensor.permute",
               "torch.transpose", "aten::mT", "torch.squeeze", "torch.unsqueeze",
               "Tensor.unflatten", "Tensor.expand", "Tensor.repeat", "torch.tile",
               "torch.flip", "torch.roll"):
        assert op in text, op
    run_both(module, graph, (2, 3, 10), (6, 10))


class Pieces(nn.Module):
    def forward(self, x, y):                                   # (2, 3, 10), (2, 3, 10)
        return (*torch.split(x, 3, 2), *x.split([2, 5, 3], -1), *torch.chunk(x, 3, 2),
                *torch.tensor_split(x, 3, 2), *torch.tensor_split(x, [1, 4], -1),
                *torch.unbind(x, 1), torch.stack((x, y), -1), torch.cat((x, y), -2),
                x[:, 1:, ::3], x[..., -3:-1], x[:, :, 2:100], x[1], x[:, -1], x.select(2, -2),
                x.narrow(1, 1, 2), x[:, -1, 2:8:2])


def test_slicing_and_splitting_operators_round_trip(pnnx_export):
    module, graph, text = exported(pnnx_export, Pieces(), [(2, 3, 10)] * 2, "pieces")
    for op in ("torch.split", "torch.chunk", "torch.tensor_split", "torch.unbind",
               "torch.stack", "torch.cat", "Tensor.slice", "Tensor.select", "torch.narrow"):
        assert op in text, op
    run_both(module, graph, (2, 3, 10), (2, 3, 10))


class PadAndResize(nn.Module):
    def __init__(self):
        super().__init__()
        self.pads = nn.ModuleList([nn.ZeroPad2d(1), nn.ConstantPad2d((1, 2, 3, 4), 2.5),
                                   nn.ReflectionPad2d(2), nn.ReplicationPad2d((1, 0, 2, 0)),
                                   nn.CircularPad2d(1), nn.ConstantPad1d(2, 1.0),
                                   nn.ReplicationPad3d(1)])
        self.resizes = nn.ModuleList([
            nn.Upsample(scale_factor=2), nn.UpsamplingNearest2d(scale_factor=2),
            nn.UpsamplingBilinear2d(size=(5, 7)), nn.Upsample(size=(3, 3), mode="bilinear"),
            nn.Upsample(scale_factor=1.5, mode="bicubic", align_corners=True),
            nn.Upsample(scale_factor=(2, 3), mode="nearest-exact"),
            nn.PixelShuffle(2), nn.PixelUnshuffle(2)])

    def forward(self, x):                                      # (2, 8, 4, 6)
        return (*(pad(x) for pad in self.pads), *(resize(x) for resize in self.resizes),
                F.pad(x, (1, 2)), F.pad(x, (1, 1, 2, 2), mode="reflect"), F.pad(x, (-1, 1)),
                F.interpolate(x, scale_factor=1.7, mode="bilinear"),
                F.interpolate(x, size=(5, 9), mode="bilinear", align_corners=True),
                F.interpolate(x, scale_factor=(0.5, 1.5)), F.upsample_nearest(x, scale_factor=3),
                F.upsample_bilinear(x, size=(3, 4)), F.pixel_shuffle(x, 2),
                F.interpolate(x, scale_factor=2.5, mode="nearest-exact"))


@pytest.mark.filterwarnings("ignore:`nn.functional.upsample")
def test_padding_and_resizing_operators_round_trip(pnnx_export):
    module, graph, text = exported(pnnx_export, PadAndResize(), [(2, 8, 4, 6)], "pad_resize")
    for op in ("nn.ZeroPad2d", "nn.ConstantPad2d", "nn.ReflectionPad2d", "nn.ReplicationPad2d",
               "nn.ConstantPad1d", "nn.ReplicationPad3d", "F.pad", "nn.Upsample",
               "nn.UpsamplingNearest2d", "nn.UpsamplingBilinear2d", "nn.PixelShuffle",
               "nn.PixelUnshuffle", "F.upsample", "F.upsample_nearest", "F.interpolate",
               "F.pixel_shuffle"):
        assert op in text, op
    run_both(module, graph, (2, 8, 4, 6))


class Linear1d(nn.Module):
    def forward(self, x):                                      # (2, 3, 7)
        return (F.interpolate(x, size=9, mode="linear"), nn.Upsample(scale_factor=3)(x),
                F.interpolate(x, scale_factor=1.5, mode="linear", align_corners=True),
                nn.ReflectionPad1d((1, 2))(x), nn.ReplicationPad1d(1)(x),
                nn.CircularPad1d(2)(x))


def test_one_dimensional_resizing_and_padding_round_trip(pnnx_export):
    module, graph, _ = exported(pnnx_export, Linear1d(), [(2, 3, 7)], "linear_1d")
    run_both(module, graph, (2, 3, 7))


class ShapeArithmetic(nn.Module):
    """Arguments computed from input sizes: pnnx writes them as pnnx.Expression (and
    pnnx.SliceIndexes) operators feeding named inputs."""

    def forward(self, x, y):                                   # (N, C, H, W), (N, C, 2H, 2W)
        n, c, h, w = x.shape
        flat = x.view(x.size(0), -1)
        half = x[:, :, : h // 2]
        window = x[:, c // 2:, : h // 2]                        # fused: computed bounds
        row = x[:, -1, h // 3]                                  # fused: computed select
        last = x.select(2, h - 1)
        grown = x[:, :1, :1].expand(n, c, h, -1)
        up = F.interpolate(x, size=y.shape[2:], mode="bilinear")
        near = F.interpolate(x, size=(h * 2, w + 1))
        ones = x.new_ones((n, 2, w))
        zeros = torch.zeros(n, 3)
        return flat, half, window, row, last, grown, up, near, ones, zeros


def test_shape_arithmetic_is_planned_and_run_at_new_sizes(pnnx_export):
    module, graph, text = exported(pnnx_export, ShapeArithmetic(), [(1, 4, 6, 8), (1, 4, 12, 16)],
                                   "shape_arithmetic", dynamic=True)
    assert "pnnx.SliceIndexes" in text and "$shape=" in text and "$size=" in text
    for shapes in [((1, 4, 6, 8), (1, 4, 12, 16)), ((3, 4, 9, 5), (3, 4, 18, 10))]:
        planned = graph.infer_shapes(*shapes)            # planned before anything runs
        assert planned[graph.output_operands[0].name] == (shapes[0][0], int(np.prod(
            shapes[0][1:])))
        run_both(module, graph, *shapes)
