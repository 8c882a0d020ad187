"""F.grid_sample and F.affine_grid against torch: every mode, padding mode and align_corners,
grids reaching past the image, pnnx exports of a spatial transformer and a flow warp."""

import numpy as np
import pytest
import torch.nn.functional as F
from torch import nn

from helpers import check_export, check_layer, make_layer
from support import case_id
from parser.errors import LayerError, ShapeError


def grid(shape, seed=0):
    """Positions in [-1.6, 1.6]: inside the image, past every edge, and exactly on -1, 0, 1."""
    rng = np.random.default_rng(seed)
    g = rng.uniform(-1.6, 1.6, shape).astype(np.float32)
    g.reshape(-1)[:6] = [-1, 1, 0, 1, -1, 0]
    return g


@pytest.mark.parametrize("mode", ["bilinear", "nearest", "bicubic"])
@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align_corners", [False, True])
def test_grid_sample_matches_torch(mode, padding_mode, align_corners):
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 9)).astype(np.float32)
    params = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    check_layer("F.grid_sample", lambda t, g: F.grid_sample(t, g, **params),
                [x, grid((2, 5, 6, 2))], params)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (1, 2, 1, 5), (3, 1, 4, 1)], ids=case_id)
def test_grid_sample_of_one_pixel_wide_images(shape):
    params = {"mode": "bilinear", "padding_mode": "reflection", "align_corners": True}
    check_layer("F.grid_sample", lambda t, g: F.grid_sample(t, g, **params),
                [shape, grid((shape[0], 3, 4, 2))], params)


@pytest.mark.parametrize("width", [5, 10, 224])
@pytest.mark.parametrize("align_corners", [False, True])
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_positions_half_way_between_pixels_round_as_torch(width, align_corners, mode):
    """A position exactly half-way between two pixels: nearest must pick torch's pixel (its
    coordinates are float32, computed in torch's order)."""
    halves = np.arange(-2, 2 * width + 2) / 2.0                  # pixel coordinates
    gx = halves / ((width - 1) / 2) - 1 if align_corners else (halves + 0.5) / (width / 2) - 1
    g = np.stack([gx, np.zeros_like(gx)], -1).reshape(1, 1, -1, 2).astype(np.float32)
    x = np.random.default_rng(3).standard_normal((1, 2, 3, width)).astype(np.float32)
    params = {"mode": mode, "padding_mode": "zeros", "align_corners": align_corners}
    check_layer("F.grid_sample", lambda t, grid_: F.grid_sample(t, grid_, **params), [x, g],
                params)


@pytest.mark.parametrize("padding_mode", ["zeros", "border", "reflection"])
def test_a_nan_pixel_is_not_read_from_outside_the_image(padding_mode):
    x = np.arange(10, dtype=np.float32).reshape(1, 1, 2, 5)
    x[..., -1] = np.nan
    params = {"mode": "bilinear", "padding_mode": padding_mode, "align_corners": False}
    got = check_layer("F.grid_sample", lambda t, g: F.grid_sample(t, g, **params),
                      [x, np.array([[[[1.5, 0.0], [-0.5, 0.0]]]], np.float32)], params)
    assert not np.isnan(got[0]).all()


@pytest.mark.parametrize("shapes", [[(0, 2, 3, 3), (0, 2, 2, 2)], [(2, 2, 3, 3), (2, 0, 4, 2)]],
                         ids=case_id)
def test_grid_sample_of_empty_batches_and_grids(shapes):
    params = {"mode": "bicubic", "padding_mode": "zeros", "align_corners": False}
    check_layer("F.grid_sample", lambda t, g: F.grid_sample(t, g, **params), shapes, params)


@pytest.mark.parametrize("size", [(2, 3, 5, 7), (1, 1, 1, 4), (1, 2, 6, 1)], ids=case_id)
@pytest.mark.parametrize("align_corners", [False, True])
def test_affine_grid_matches_torch(size, align_corners):
    if align_corners and 1 in size[2:]:
        pytest.skip("torch warns that a unit-size grid with align_corners is not a use case")
    check_layer("F.affine_grid", lambda t: F.affine_grid(t, size, align_corners=align_corners),
                [(size[0], 2, 3)], {"size": size, "align_corners": align_corners})


class SpatialTransformer(nn.Module):
    """A localisation net predicts an affine warp; the image is resampled through it."""

    def __init__(self):
        super().__init__()
        self.loc = nn.Sequential(nn.Conv2d(3, 4, 3, 2, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                                 nn.Flatten(), nn.Linear(4, 6))

    def forward(self, x):
        theta = self.loc(x).view(-1, 2, 3)
        warped = F.grid_sample(x, F.affine_grid(theta, list(x.shape), align_corners=False),
                               align_corners=False)
        return warped, F.grid_sample(x, F.affine_grid(theta, [2, 3, 5, 4], align_corners=True),
                                     mode="nearest", padding_mode="border", align_corners=True)


class FlowWarp(nn.Module):
    """RAFT-style: an image read at positions a flow field gives (the grid is an input)."""

    def forward(self, x, flow):
        return F.grid_sample(x, flow.permute(0, 2, 3, 1), mode="bicubic",
                             padding_mode="reflection", align_corners=True)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_pnnx_export_of_a_spatial_transformer_matches_torch(pnnx_export):
    check_export(pnnx_export, SpatialTransformer(), [(2, 3, 12, 10)], "stn",
                 ["F.affine_grid", "F.grid_sample"])


def test_pnnx_export_of_a_flow_warp_matches_torch(pnnx_export):
    flow = np.moveaxis(grid((2, 6, 5, 2), seed=2), 3, 1).copy()
    check_export(pnnx_export, FlowWarp(), [(2, 3, 8, 7), flow], "flow_warp", ["F.grid_sample"])


@pytest.mark.parametrize("params, shapes, kind, message", [
    ({"mode": "area"}, [(1, 1, 4, 4), (1, 2, 2, 2)], LayerError, "mode='area'"),
    ({"padding_mode": "wrap"}, [(1, 1, 4, 4), (1, 2, 2, 2)], LayerError, "padding_mode"),
    ({}, [(1, 1, 4, 4), (2, 2, 2, 2)], ShapeError, "grid"),
    ({}, [(1, 1, 4, 4), (1, 2, 2, 3)], ShapeError, "grid"),
    ({}, [(1, 1, 2, 4, 4), (1, 2, 2, 2, 3)], ShapeError, "5-D"),
], ids=case_id)
def test_grid_sample_refuses_what_it_cannot_do(params, shapes, kind, message):
    with pytest.raises(kind, match=message):
        make_layer("F.grid_sample", params).infer_shapes(shapes)


def test_affine_grid_refuses_a_theta_of_the_wrong_shape():
    with pytest.raises(ShapeError, match="theta must be"):
        make_layer("F.affine_grid", {"size": (2, 3, 4, 4)}).infer_shapes([(2, 3, 3)])
