"""Interpolation (F.interpolate, F.upsample*, nn.Upsample*) and pixel (un)shuffle against
torch: every mode, align_corners both ways, by size or by (non-integer) scale factor, up and
down, 1-D / 2-D / 3-D, and a size computed in the graph."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_export, check_layer, make_layer, rand
from support import case_id
from layers import LayerRegisterer
from layers import resize as resize_layers
from parser.errors import LayerError, ShapeError

CASES = [  # (mode, align_corners, size, scale_factor)
    ("nearest", None, None, 2.0), ("nearest", None, None, 3.0), ("nearest", None, None, 1.7),
    ("nearest", None, None, 0.5), ("nearest", None, None, 1.2), ("nearest", None, None, 0.3),
    ("nearest", None, (5, 9), None), ("nearest", None, (3, 4), None),
    ("nearest-exact", None, None, 2.5), ("nearest-exact", None, (7, 5), None),
    ("nearest-exact", None, None, 0.6),
    ("bilinear", False, None, 2.0), ("bilinear", True, None, 2.0),
    ("bilinear", False, None, 1.7), ("bilinear", True, None, 1.7),
    ("bilinear", False, (5, 9), None), ("bilinear", True, (3, 4), None),
    ("bilinear", False, None, 0.4), ("bilinear", False, (1, 1), None),
    ("bilinear", True, (1, 7), None), ("bilinear", False, None, 1.2),
    ("nearest", None, None, 1.1), ("bilinear", False, None, 1.1),  # floor(in * 1.1) == in
    ("bicubic", False, (7, 7), None), ("bicubic", True, None, 1.5),
    ("bicubic", False, None, 2.0), ("bicubic", False, None, 0.6), ("bicubic", True, (3, 2), None),
]


@pytest.mark.parametrize("mode, align_corners, size, scale_factor", CASES, ids=str)
def test_interpolate_2d_matches_torch(mode, align_corners, size, scale_factor):
    params = {"mode": mode, "size": size, "scale_factor": scale_factor}
    if align_corners is not None:
        params["align_corners"] = align_corners
    check_layer("F.interpolate", lambda t: F.interpolate(
        t, size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners),
        [(2, 3, 5, 6)], params)


@pytest.mark.parametrize("mode, size, scale_factor, shape", [
    ("nearest", (10, 18), None, (2, 3, 5, 6)), ("nearest-exact", None, 3.0, (2, 3, 5, 6)),
    ("nearest-exact", (20, 12), None, (1, 2, 5, 6)), ("nearest", None, (1.0, 4.0), (1, 2, 5, 6)),
    ("nearest", None, 2.0, (1, 2, 3, 4, 5)), ("nearest", None, 2.0, (0, 2, 3, 4)),
    ("nearest", None, 2.0, (1, 16, 40, 40)),
], ids=str)
def test_whole_factor_nearest_copies_each_value_as_torch(mode, size, scale_factor, shape,
                                                        monkeypatch):
    """Every output copies input o // k on each axis: the one-pass path (resize.repeat_each),
    NaN and Inf copied as they are."""
    calls = []
    repeat_each = resize_layers.repeat_each
    monkeypatch.setattr(resize_layers, "repeat_each",
                        lambda *args: calls.append(1) or repeat_each(*args))
    x = rand(*shape)
    x.reshape(-1)[:3] = [np.nan, np.inf, -np.inf][:x.size]
    layer = make_layer("F.interpolate", {"mode": mode, "size": size,
                                         "scale_factor": scale_factor})
    (got,) = layer.forward([x])
    want = F.interpolate(torch.from_numpy(x), size=size, scale_factor=scale_factor,
                         mode=mode).numpy()
    np.testing.assert_array_equal(got, want)
    assert calls, "the whole-factor path did not run"
    out = np.full(want.shape, 7.0, np.float32)          # the graph's way: into a buffer
    layer.forward_into([x], [out])
    np.testing.assert_array_equal(out, want)
    assert len(calls) == 2


@pytest.mark.parametrize("mode, scale_factor", [("nearest", 1.5), ("bilinear", 2.0),
                                                ("nearest", 1.0)], ids=str)
def test_other_resizes_are_copied_into_the_planned_buffer(mode, scale_factor):
    x = rand(2, 3, 4, 6)
    layer = make_layer("F.interpolate", {"mode": mode, "scale_factor": scale_factor})
    want = F.interpolate(torch.from_numpy(x), scale_factor=scale_factor, mode=mode).numpy()
    out = np.full(want.shape, np.nan, np.float32)
    layer.forward_into([x], [out])
    np.testing.assert_allclose(out, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scale_factor", [(0.5, 1.5), (2.0, 3.0), (1.3, 0.7)], ids=str)
@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_interpolate_with_a_scale_factor_per_dim(mode, scale_factor):
    check_layer("F.upsample", lambda t: F.interpolate(t, scale_factor=scale_factor, mode=mode),
                [(1, 2, 6, 7)], {"mode": mode, "scale_factor": scale_factor})


@pytest.mark.parametrize("mode, align_corners, size, scale_factor", [
    ("nearest", None, None, 2.0), ("nearest", None, 9, None), ("nearest", None, None, 1.5),
    ("linear", False, 9, None), ("linear", True, None, 1.5), ("linear", False, None, 3.0),
    ("linear", False, None, 0.5), ("nearest-exact", None, None, 1.6),
], ids=str)
def test_interpolate_1d_matches_torch(mode, align_corners, size, scale_factor):
    params = {"mode": mode, "size": size, "scale_factor": scale_factor,
              "align_corners": align_corners}
    check_layer("F.interpolate", lambda t: F.interpolate(
        t, size=size, scale_factor=scale_factor, mode=mode, align_corners=align_corners),
        [(2, 3, 7)], params)


@pytest.mark.parametrize("mode, align_corners", [("trilinear", False), ("trilinear", True),
                                                 ("nearest", None)], ids=str)
def test_interpolate_3d_matches_torch(mode, align_corners):
    check_layer("F.interpolate", lambda t: F.interpolate(
        t, scale_factor=(1.5, 2.0, 0.5), mode=mode, align_corners=align_corners),
        [(1, 2, 3, 4, 6)], {"mode": mode, "scale_factor": (1.5, 2.0, 0.5),
                            "align_corners": align_corners})


def test_recompute_scale_factor_uses_the_sizes():
    check_layer("F.interpolate", lambda t: F.interpolate(
        t, scale_factor=1.7, mode="bilinear", recompute_scale_factor=True),
        [(1, 2, 5, 6)], {"mode": "bilinear", "scale_factor": 1.7, "align_corners": False,
                         "recompute_scale_factor": True})


@pytest.mark.parametrize("type_name, module, params", [
    ("nn.Upsample", nn.Upsample(scale_factor=2), {"mode": "nearest",
                                                  "scale_factor": (2.0, 2.0)}),
    ("nn.Upsample", nn.Upsample(size=(3, 3), mode="bilinear"),
     {"mode": "bilinear", "size": (3, 3), "align_corners": False}),
    ("nn.Upsample", nn.Upsample(scale_factor=1.5, mode="bicubic", align_corners=True),
     {"mode": "bicubic", "scale_factor": (1.5, 1.5), "align_corners": True}),
    ("nn.UpsamplingNearest2d", nn.UpsamplingNearest2d(scale_factor=2),
     {"scale_factor": (2.0, 2.0)}),
    ("nn.UpsamplingBilinear2d", nn.UpsamplingBilinear2d(size=(5, 7)), {"size": (5, 7)}),
    ("nn.UpsamplingBilinear2d", nn.UpsamplingBilinear2d(scale_factor=2.5),
     {"scale_factor": 2.5}),
    ("F.upsample_nearest", lambda t: F.upsample_nearest(t, scale_factor=3),
     {"scale_factor": (3.0, 3.0)}),
    ("F.upsample_bilinear", lambda t: F.upsample_bilinear(t, size=(3, 4)), {"size": (3, 4)}),
], ids=case_id)
@pytest.mark.filterwarnings("ignore:`nn.functional.upsample")
def test_upsample_modules_and_old_names_match_torch(type_name, module, params):
    check_layer(type_name, module, [(2, 3, 4, 6)], params)


def test_interpolate_takes_the_size_as_an_input():
    # F.interpolate(x, size=y.shape[2:]) -> F.upsample 2 1 x s y ... $input=x $size=s
    layer = make_layer("F.upsample", {"mode": "bilinear", "align_corners": False})
    layer.input_names = ["input", "size"]
    x = rand(1, 3, 4, 6)
    size = np.array([8, 11])
    assert layer.infer_shapes_from([x.shape, (2,)], [None, size]) == [(1, 3, 8, 11)]
    (y,) = layer.forward([x, size])
    want = F.interpolate(torch.from_numpy(x), size=(8, 11), mode="bilinear")
    np.testing.assert_allclose(y, want.numpy(), atol=1e-5)


@pytest.mark.parametrize("params, shape", [
    ({"mode": "bilinear", "scale_factor": 2.0}, (2, 3, 4)),     # bilinear needs 4-D
    ({"mode": "linear", "size": 4}, (2, 3, 4, 5)),
    ({"mode": "nearest"}, (2, 3, 4, 5)),                        # neither size nor scale
    ({"mode": "nearest", "size": (4, 4), "scale_factor": 2.0}, (2, 3, 4, 5)),
    ({"mode": "nearest", "size": (4, 4, 4)}, (2, 3, 4, 5)),
    ({"mode": "nearest", "scale_factor": 0.1}, (2, 3, 4, 5)),   # empty output
], ids=str)
def test_impossible_resizes_are_shape_errors(params, shape):
    with pytest.raises(ShapeError):
        make_layer("F.interpolate", params).infer_shapes([shape])


@pytest.mark.parametrize("params", [
    {"mode": "area", "size": 2}, {"mode": "nearest", "size": 2, "align_corners": True},
    {"mode": "nearest", "size": 2, "antialias": True}, {"scale_factor": -2.0},
], ids=str)
def test_bad_interpolate_params_are_layer_errors(params):
    with pytest.raises(LayerError):
        make_layer("F.interpolate", params)


@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("size, align_corners", [((7, 5), False), ((3, 11), True),
                                                 ((40, 9), False), ((16, 30), True)], ids=str)
def test_antialiased_resize_matches_torch(mode, size, align_corners):
    """Shrinking stretches the filter over every input it covers; growing is plain
    interpolation with the weights normalised at the edges (torch's _aa kernels)."""
    params = {"size": size, "mode": mode, "align_corners": align_corners, "antialias": True}
    check_layer("F.interpolate", lambda t: F.interpolate(t, **params), [(2, 3, 16, 12)],
                params)


class Thumbnail(nn.Module):
    """Both overloads pnnx writes: (size, align_corners, scales_h, scales_w) and
    (size or None, align_corners, scale_factors)."""

    def forward(self, x):
        return (F.interpolate(x, size=(5, 7), mode="bilinear", antialias=True),
                F.interpolate(x, scale_factor=0.3, mode="bicubic", antialias=True,
                              align_corners=True),
                F.interpolate(x, scale_factor=(0.5, 0.25), mode="bilinear", antialias=True,
                              recompute_scale_factor=True),
                F.interpolate(x, scale_factor=1.7, mode="bilinear", antialias=True))


def test_pnnx_export_of_an_antialiased_resize_matches_torch(pnnx_export):
    check_export(pnnx_export, Thumbnail(), [(1, 3, 20, 24)], "thumbnail",
                 ["aten::_upsample_bilinear2d_aa", "aten::_upsample_bicubic2d_aa"])


# ----- pixel shuffle ------------------------------------------------------------------------------

@pytest.mark.parametrize("factor, shape", [(2, (2, 8, 4, 6)), (3, (1, 9, 2, 3)),
                                           (2, (4, 3, 5)), (1, (1, 2, 3, 3)),
                                           (2, (2, 3, 4, 2, 2))], ids=str)
def test_pixel_shuffle_matches_torch(factor, shape):
    check_layer("F.pixel_shuffle", lambda t: F.pixel_shuffle(t, factor), [shape],
                {"upscale_factor": factor})
    check_layer("nn.PixelShuffle", nn.PixelShuffle(factor), [shape],
                {"upscale_factor": factor})


@pytest.mark.parametrize("factor, shape", [(2, (2, 2, 4, 6)), (3, (1, 1, 6, 3)),
                                           (2, (3, 4, 2))], ids=str)
def test_pixel_unshuffle_matches_torch(factor, shape):
    check_layer("F.pixel_unshuffle", lambda t: F.pixel_unshuffle(t, factor), [shape],
                {"downscale_factor": factor})
    check_layer("nn.PixelUnshuffle", nn.PixelUnshuffle(factor), [shape],
                {"downscale_factor": factor})


@pytest.mark.parametrize("type_name, params", [("F.pixel_shuffle", {"upscale_factor": 1}),
                                                ("F.pixel_unshuffle", {"downscale_factor": 1})])
def test_a_shuffle_by_1_returns_its_input_read_only(type_name, params):
    """By 1 the output is x itself: read-only, or the graph would run an in-place step over
    it, and over whatever else reads x."""
    x = rand(1, 4, 3, 3)
    (y,) = make_layer(type_name, params).forward([x])
    np.testing.assert_array_equal(y, x)
    assert not (np.shares_memory(x, y) and y.flags.writeable)


def test_pixel_shuffle_shapes_that_do_not_divide_are_shape_errors():
    with pytest.raises(ShapeError, match="C\\*4"):
        make_layer("F.pixel_shuffle", {"upscale_factor": 2}).infer_shapes([(1, 6, 2, 2)])
    with pytest.raises(ShapeError, match="H\\*2"):
        make_layer("F.pixel_unshuffle", {"downscale_factor": 2}).infer_shapes([(1, 1, 3, 4)])


@pytest.mark.parametrize("type_name, layer_class", [
    ("F.interpolate", resize_layers.Interpolate), ("F.upsample", resize_layers.Interpolate),
    ("nn.Upsample", resize_layers.Interpolate),
    ("F.upsample_nearest", resize_layers.UpsampleNearest),
    ("nn.UpsamplingNearest2d", resize_layers.UpsampleNearest),
    ("F.upsample_bilinear", resize_layers.UpsampleBilinear),
    ("nn.UpsamplingBilinear2d", resize_layers.UpsampleBilinear),
    ("F.pixel_shuffle", resize_layers.PixelShuffle),
    ("nn.PixelShuffle", resize_layers.PixelShuffle),
    ("F.pixel_unshuffle", resize_layers.PixelUnshuffle),
    ("nn.PixelUnshuffle", resize_layers.PixelUnshuffle)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class
