"""F.unfold / nn.Unfold and F.fold / nn.Fold against torch: window geometries, batched and
unbatched inputs, pnnx exports, and the shapes torch refuses."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_export, check_layer, make_layer
from support import case_id
from parser.errors import LayerError, ShapeError

GEOMETRIES = [
    {"kernel_size": (2, 2), "stride": (2, 2)},
    {"kernel_size": (3, 3), "padding": (1, 1)},
    {"kernel_size": (3, 2), "dilation": (2, 1), "stride": (1, 2), "padding": (2, 0)},
    {"kernel_size": (1, 1)},
    {"kernel_size": (4, 4), "stride": (3, 3), "padding": (1, 1)},
]


def _full(geometry):
    return {"dilation": (1, 1), "padding": (0, 0), "stride": (1, 1), **geometry}


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=case_id)
@pytest.mark.parametrize("shape", [(2, 3, 9, 8), (3, 7, 10)], ids=case_id)
def test_unfold_matches_torch(geometry, shape):
    check_layer("F.unfold", lambda t: F.unfold(t, **geometry), [shape], _full(geometry))


@pytest.mark.parametrize("geometry", GEOMETRIES, ids=case_id)
@pytest.mark.parametrize("batched", [True, False])
def test_fold_matches_torch_and_sums_overlaps(geometry, batched):
    size = (9, 8)
    columns = F.unfold(torch.rand(2, 3, *size), **geometry)        # the shape fold expects
    shape = tuple(columns.shape) if batched else tuple(columns.shape[1:])
    check_layer("F.fold", lambda t: F.fold(t, size, **geometry), [shape],
                {"output_size": size, **_full(geometry)})


class Patches(nn.Module):
    """Unfold into patches, scale them, fold back (MobileViT-v2, T2T-ViT)."""

    def __init__(self):
        super().__init__()
        self.unfold = nn.Unfold(kernel_size=3, padding=1, stride=2)
        self.fold = nn.Fold(output_size=(7, 9), kernel_size=3, padding=1, stride=2)

    def forward(self, x):
        exact = F.fold(F.unfold(x[:, :, :6, :8], 2, stride=2) * 2.0, (6, 8), 2, stride=2)
        return self.fold(self.unfold(x) * 0.5), exact


def test_pnnx_export_of_unfold_and_fold_matches_torch(pnnx_export):
    types = check_export(pnnx_export, Patches(), [(1, 2, 7, 9)], "patches")
    assert {"nn.Unfold", "nn.Fold", "F.unfold", "F.fold"} <= set(types)


@pytest.mark.parametrize("type_name, params, shape, message", [
    ("F.unfold", {"kernel_size": (5, 5)}, (1, 2, 3, 3), "does not fit"),
    ("F.unfold", {"kernel_size": (2, 2)}, (2, 3), "takes"),
    ("F.fold", {"kernel_size": (2, 2), "output_size": (4, 4), "stride": (2, 2)}, (1, 10, 4),
     "multiple of"),
    ("F.fold", {"kernel_size": (2, 2), "output_size": (4, 4), "stride": (2, 2)}, (1, 8, 5),
     "5 columns"),
], ids=case_id)
def test_bad_shapes_are_shape_errors(type_name, params, shape, message):
    with pytest.raises(ShapeError, match=message):
        make_layer(type_name, params).infer_shapes([shape])


def test_bad_geometry_is_a_layer_error():
    with pytest.raises(LayerError, match="stride"):
        make_layer("F.unfold", {"kernel_size": (2, 2), "stride": (0, 1)})


@pytest.mark.parametrize("shape, dimension, size, step", [
    ((1, 4, 10, 10), 2, 4, 3), ((5,), 0, 2, 1), ((3, 7), -1, 7, 2), ((3, 7), 1, 0, 2),
    ((), 0, 1, 1), ((2, 6), 0, 1, 5), ((2, 3, 9), 2, 3, 3),
], ids=case_id)
def test_tensor_unfold_matches_torch(shape, dimension, size, step):
    params = {"dimension": dimension, "size": size, "step": step}
    for type_name in ("Tensor.unfold", "aten::unfold"):
        check_layer(type_name, lambda t: t.unfold(dimension, size, step), [shape], params)


@pytest.mark.parametrize("params, message", [
    ({"dimension": 1, "size": 8, "step": 1}, "does not fit"),
    ({"dimension": 2, "size": 2, "step": 1}, "dim"),
], ids=case_id)
def test_tensor_unfold_refuses_what_torch_refuses(params, message):
    with pytest.raises((ShapeError, LayerError), match=message):
        make_layer("Tensor.unfold", params).infer_shapes_from([(3, 7)], [None])
