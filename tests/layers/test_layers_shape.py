"""Reshaping and reordering layers against torch: flatten / unflatten, reshape / view (also
with a computed shape), reshape_as, permute, transpose, t / T / mT, squeeze / unsqueeze,
expand / repeat / tile, flip, roll and the identities."""

import numpy as np
import pytest
import torch
from torch import nn

from helpers import check_export, check_layer, make_layer, rand
from support import case_id
from layers import LayerRegisterer
from layers import shape as shape_layers
from parser.errors import LayerError, ShapeError


# ----- flatten / unflatten / reshape ------------------------------------------------------------

@pytest.mark.parametrize("start_dim, end_dim", [(0, -1), (1, -1), (1, 2), (-3, -2), (2, 2),
                                                (0, 0), (3, -1)], ids=str)
def test_flatten_matches_torch(start_dim, end_dim):
    params = {"start_dim": start_dim, "end_dim": end_dim}
    check_layer("torch.flatten", lambda t: torch.flatten(t, start_dim, end_dim),
                [(2, 3, 4, 5)], params)


def test_flatten_defaults_differ_between_function_and_module():
    check_layer("torch.flatten", torch.flatten, [(2, 3, 4)], {})
    check_layer("nn.Flatten", nn.Flatten(), [(2, 3, 4)], {})


def test_flatten_start_after_end_is_a_shape_error():
    with pytest.raises(ShapeError, match="start_dim"):
        make_layer("torch.flatten", {"start_dim": 2, "end_dim": 1}).infer_shapes([(2, 3, 4)])


@pytest.mark.parametrize("dim, sizes", [(1, (3, 4)), (1, (-1, 2)), (-1, (5, 1)), (0, (1, 2))],
                         ids=str)
def test_unflatten_matches_torch(dim, sizes):
    check_layer("Tensor.unflatten", lambda t: t.unflatten(dim, sizes), [(2, 12, 5)],
                {"dim": dim, "sizes": sizes})


def test_unflatten_that_does_not_fit_is_a_shape_error():
    with pytest.raises(ShapeError, match="cannot reshape"):
        make_layer("Tensor.unflatten", {"dim": 1, "sizes": (5, -1)}).infer_shapes([(2, 12)])


@pytest.mark.parametrize("target", [(2, 60), (-1, 60), (2, -1), (5, -1, 4), (120,), (-1,),
                                    (2, 3, 4, 5, 1)], ids=str)
def test_reshape_matches_torch(target):
    check_layer("Tensor.reshape", lambda t: t.reshape(target), [(2, 3, 4, 5)],
                {"shape": target})


def test_reshape_takes_the_shape_as_a_second_input():
    # pnnx: Tensor.reshape 2 1 x s y $input=x $shape=s, s from expr=[size(@0,0),-1]
    layer = make_layer("Tensor.reshape")
    x = rand(2, 3, 4)
    (y,) = layer.forward([x, [2, -1]])
    np.testing.assert_array_equal(y, x.reshape(2, 12))
    with pytest.raises(ShapeError, match="not known before the graph runs"):
        layer.infer_shapes([(2, 3, 4), (2,)])
    target = np.array([3, -1], np.int64)            # known while planning: shape arithmetic
    assert layer.infer_shapes_from([(2, 3, 4), (2,)], [None, target]) == [(3, 8)]
    layer.input_names = ["input", "shape"]          # as the graph names them
    assert layer.infer_shapes_from([(2, 3, 4), (2,)], [None, target]) == [(3, 8)]


@pytest.mark.parametrize("target", [(7, -1), (5, 5), (-1, -1), (2, -2)], ids=str)
def test_reshape_that_does_not_fit_names_both_shapes(target):
    layer = make_layer("Tensor.view", {"shape": target})
    with pytest.raises(ShapeError) as error:
        layer.infer_shapes([(2, 3, 4)])
    assert "(2, 3, 4)" in str(error.value) and str(target) in str(error.value)


@pytest.mark.parametrize("type_name", ["Tensor.reshape_as", "Tensor.view_as", "aten::view_as"])
def test_reshape_as_takes_the_shape_of_the_other_input(type_name):
    other = rand(4, 6)
    check_layer(type_name, lambda t, o: t.reshape_as(o), [(2, 3, 4), other])
    with pytest.raises(ShapeError, match="cannot reshape"):
        make_layer(type_name).infer_shapes([(2, 3, 4), (5, 5)])


def test_views_of_the_input_are_read_only():
    x = rand(2, 3, 4)
    for type_name, params in [("Tensor.reshape", {"shape": (6, 4)}), ("torch.flatten", {}),
                              ("nn.Identity", {}), ("Tensor.permute", {"dims": (2, 0, 1)}),
                              ("torch.squeeze", {}), ("torch.unsqueeze", {"dim": 0}),
                              ("torch.flip", {"dims": (1,)}),
                              ("Tensor.expand", {"sizes": (2, 2, 3, 4)})]:
        (y,) = make_layer(type_name, params).forward([x])
        assert np.shares_memory(x, y) and not y.flags.writeable, type_name
        assert x.flags.writeable


# ----- permute / transpose ---------------------------------------------------------------------

@pytest.mark.parametrize("dims", [(0, 2, 1), (2, 0, 1), (-1, 0, 1), (1, 0, 2), (0, 1, 2)],
                         ids=str)
def test_permute_matches_torch(dims):
    check_layer("Tensor.permute", lambda t: t.permute(dims), [(2, 3, 4)], {"dims": dims})


@pytest.mark.parametrize("dims", [(0, 1), (0, 1, 1), (0, 1, 3)], ids=str)
def test_permute_with_bad_dims_is_a_shape_error(dims):
    with pytest.raises(ShapeError):
        make_layer("Tensor.permute", {"dims": dims}).infer_shapes([(2, 3, 4)])


@pytest.mark.parametrize("dim0, dim1", [(0, 2), (-1, -2), (1, 1), (0, -1)], ids=str)
def test_transpose_matches_torch(dim0, dim1):
    check_layer("torch.transpose", lambda t: torch.transpose(t, dim0, dim1), [(2, 3, 4)],
                {"dim0": dim0, "dim1": dim1})


@pytest.mark.parametrize("type_name, torch_fn, shapes", [
    ("torch.t", torch.t, [(3, 5), (4,)]),
    ("aten::numpy_T", lambda t: t.permute(*reversed(range(t.dim()))), [(3, 5), (2, 3, 4)]),
    ("aten::mT", lambda t: t.mT, [(3, 5), (2, 3, 4)]),
], ids=case_id)
def test_matrix_transposes_match_torch(type_name, torch_fn, shapes):
    for shape in shapes:
        check_layer(type_name, torch_fn, [shape])


def test_t_of_3d_and_mT_of_1d_are_shape_errors():
    with pytest.raises(ShapeError, match="at most 2 dims"):
        make_layer("torch.t").infer_shapes([(2, 3, 4)])
    with pytest.raises(ShapeError, match="at least 2 dims"):
        make_layer("aten::mT").infer_shapes([(4,)])


# ----- squeeze / unsqueeze ----------------------------------------------------------------------

@pytest.mark.parametrize("dim", [None, 1, -1, 0, (1, 3), (0, -1), 2], ids=str)
def test_squeeze_matches_torch(dim):
    fn = (lambda t: torch.squeeze(t)) if dim is None else (lambda t: torch.squeeze(t, dim))
    check_layer("torch.squeeze", fn, [(2, 1, 3, 1)], {} if dim is None else {"dim": dim})


@pytest.mark.parametrize("dim", [0, 1, 3, -1, -4], ids=str)
def test_unsqueeze_matches_torch(dim):
    check_layer("torch.unsqueeze", lambda t: torch.unsqueeze(t, dim), [(2, 3, 4)],
                {"dim": dim})


def test_squeeze_and_unsqueeze_dims_out_of_range_are_shape_errors():
    with pytest.raises(ShapeError, match="out of range"):
        make_layer("torch.squeeze", {"dim": 4}).infer_shapes([(2, 1, 3, 1)])
    with pytest.raises(ShapeError, match="out of range"):
        make_layer("torch.unsqueeze", {"dim": 4}).infer_shapes([(2, 3, 4)])


# ----- expand / repeat / tile ------------------------------------------------------------------

@pytest.mark.parametrize("sizes", [(2, 3, 10), (-1, 3, -1), (4, 2, -1, 10), (2, 1, 10),
                                   (0, 2, 3, 10)], ids=str)
def test_expand_matches_torch(sizes):
    check_layer("Tensor.expand", lambda t: t.expand(*sizes), [(2, 1, 10)], {"sizes": sizes})


@pytest.mark.parametrize("sizes", [(3, 1, 10), (2, 10), (-1, 2, 1, 10), (2, 1, -2)], ids=str)
def test_expand_to_an_impossible_shape_is_a_shape_error(sizes):
    with pytest.raises(ShapeError, match="cannot expand"):
        make_layer("Tensor.expand", {"sizes": sizes}).infer_shapes([(2, 1, 10)])


def test_expand_takes_the_sizes_as_a_second_input():
    layer = make_layer("Tensor.expand")
    layer.input_names = ["input", "sizes"]
    x = rand(1, 1, 5)
    assert layer.infer_shapes_from([(1, 1, 5), (3,)], [None, np.array([4, -1, 5])]) == \
        [(4, 1, 5)]
    (y,) = layer.forward([x, np.array([4, 3, -1])])
    np.testing.assert_array_equal(y, torch.from_numpy(x).expand(4, 3, -1).numpy())


def test_expand_as_matches_torch():
    check_layer("Tensor.expand_as", lambda t, o: t.expand_as(o), [(2, 1, 5), rand(3, 2, 4, 5)])
    with pytest.raises(ShapeError):
        make_layer("Tensor.expand_as").infer_shapes([(2, 3), (2, 4)])


@pytest.mark.parametrize("sizes", [(1, 2, 3), (2, 1, 1, 1), (1, 1, 1), (3, 2, 1, 2),
                                   (1, 0, 2)], ids=str)
def test_repeat_matches_torch(sizes):
    check_layer("Tensor.repeat", lambda t: t.repeat(*sizes), [(2, 1, 4)], {"sizes": sizes})


def test_repeat_with_fewer_sizes_than_dims_is_a_shape_error():
    with pytest.raises(ShapeError, match="at least one per dim"):
        make_layer("Tensor.repeat", {"sizes": (2, 2)}).infer_shapes([(2, 1, 4)])


@pytest.mark.parametrize("dims", [(2,), (1, 2), (2, 1, 1), (2, 1, 1, 3)], ids=str)
def test_tile_matches_torch(dims):
    check_layer("torch.tile", lambda t: torch.tile(t, dims), [(2, 3, 4)], {"dims": dims})


@pytest.mark.parametrize("repeats, dim, shape", [
    (3, 0, (2, 3)), (2, -1, (2, 3, 4)), ((1, 0, 2), 1, (2, 3)), (2, None, (2, 3)),
    ((4,), 0, (2, 3)), (0, 1, (2, 3)), (2, None, ()), ((2, 1), None, (2,)),
], ids=case_id)
def test_repeat_interleave_matches_torch(repeats, dim, shape):
    counts = torch.tensor(repeats) if isinstance(repeats, tuple) else repeats
    check_layer("torch.repeat_interleave",
                lambda t: torch.repeat_interleave(t, counts, dim=dim), [shape],
                {"repeats": repeats, "dim": dim})


@pytest.mark.parametrize("repeats, dim, shape, message", [
    ((1, 2), 1, (2, 3), "2 counts for 3 elements"), (-1, 0, (2, 3), "must be >= 0"),
    (2, 2, (2, 3), "dim"), (3, 0, (), "0-d input repeats with dim=None"),
], ids=case_id)
def test_repeat_interleave_refuses_bad_counts(repeats, dim, shape, message):
    layer = make_layer("torch.repeat_interleave", {"repeats": repeats, "dim": dim})
    with pytest.raises((ShapeError, LayerError), match=message):
        layer.infer_shapes_from([shape], [None])


class WindowRepeat(nn.Module):
    """GC-ViT's global query, repeated once per window."""

    def __init__(self):
        super().__init__()
        self.register_buffer("counts", torch.tensor([1, 0, 3]))

    def forward(self, x):
        return (torch.repeat_interleave(x, 4, dim=0), x.repeat_interleave(2, dim=-1),
                torch.repeat_interleave(x, self.counts, dim=1))


def test_pnnx_export_of_repeat_interleave_matches_torch(pnnx_export):
    check_export(pnnx_export, WindowRepeat(), [(2, 3, 5)], "window_repeat",
                 ["torch.repeat_interleave"])


# ----- flip / roll ------------------------------------------------------------------------------

@pytest.mark.parametrize("dims", [(1,), (-1, 0), (0, 1, 2)], ids=str)
def test_flip_matches_torch(dims):
    check_layer("torch.flip", lambda t: torch.flip(t, dims), [(2, 3, 5)], {"dims": dims})


@pytest.mark.parametrize("shifts, dims", [((2,), (1,)), ((1, -2), (0, 2)), ((3,), None),
                                          ((-1,), (-1,)), ((7,), (2,)), ((1, 1), (1, 1))],
                         ids=str)
def test_roll_matches_torch(shifts, dims):
    fn = (lambda t: torch.roll(t, shifts)) if dims is None else \
        (lambda t: torch.roll(t, shifts, dims))
    check_layer("torch.roll", fn, [(2, 3, 5)], {"shifts": shifts, "dims": dims})


def test_bad_flip_and_roll_arguments():
    with pytest.raises(ShapeError, match="twice"):
        make_layer("torch.flip", {"dims": (1, -2)}).infer_shapes([(2, 3, 5)])
    with pytest.raises(LayerError, match="differ in length"):
        make_layer("torch.roll", {"shifts": (1, 2), "dims": (0,)})
    with pytest.raises(LayerError, match="needs dims"):
        make_layer("torch.roll", {"shifts": (1, 2)})


# ----- identities, known values, registrations ----------------------------------------------------

@pytest.mark.parametrize("type_name, params", [
    ("nn.Identity", {}), ("nn.Dropout", {"p": 0.5}), ("nn.Dropout2d", {}),
    ("F.dropout", {"p": 0.1, "training": False}), ("Tensor.contiguous", {}),
    ("Tensor.clone", {})], ids=str)
def test_identities_return_their_input(type_name, params):
    check_layer(type_name, lambda t: t, [(2, 3, 4)], params)


def test_known_values_pass_through_data_movement():
    """Shape arithmetic that goes through a reshape or a permute stays known while the graph
    plans shapes; an unknown input gives no values."""
    sizes = np.array([[2, 3], [4, 5]], np.int64)
    (moved,) = make_layer("Tensor.permute", {"dims": (1, 0)}).infer_values([(2, 2)], [sizes])
    np.testing.assert_array_equal(moved, sizes.T)
    assert make_layer("torch.flatten").infer_values([(2, 2)], [None]) is None


@pytest.mark.parametrize("type_name, layer_class", [
    ("torch.flatten", shape_layers.Flatten), ("nn.Flatten", shape_layers.FlattenModule),
    ("Tensor.reshape", shape_layers.Reshape), ("Tensor.view", shape_layers.Reshape),
    ("Tensor.view_as", shape_layers.ReshapeAs), ("aten::view_as", shape_layers.ReshapeAs),
    ("Tensor.unflatten", shape_layers.Unflatten), ("Tensor.permute", shape_layers.Permute),
    ("torch.transpose", shape_layers.Transpose), ("torch.t", shape_layers.MatrixTranspose),
    ("aten::numpy_T", shape_layers.ReverseDims), ("aten::mT", shape_layers.SwapLastTwo),
    ("torch.squeeze", shape_layers.Squeeze), ("torch.unsqueeze", shape_layers.Unsqueeze),
    ("Tensor.expand", shape_layers.Expand), ("Tensor.expand_as", shape_layers.ExpandAs),
    ("Tensor.repeat", shape_layers.Repeat), ("torch.tile", shape_layers.Tile),
    ("torch.flip", shape_layers.Flip), ("torch.roll", shape_layers.Roll),
    ("nn.Identity", shape_layers.Identity), ("nn.Dropout", shape_layers.Identity)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class


@pytest.mark.parametrize("groups, shape", [(2, (2, 6, 3, 4)), (3, (1, 6, 5)), (4, (2, 8, 2, 3, 2)),
                                           (1, (1, 5, 2)), (6, (1, 6, 1, 1))], ids=str)
def test_channel_shuffle_matches_torch(groups, shape):
    check_layer("nn.ChannelShuffle", nn.ChannelShuffle(groups), [shape], {"groups": groups})


@pytest.mark.parametrize("groups", [1, 6])
def test_a_channel_shuffle_that_moves_nothing_returns_its_input_read_only(groups):
    """One group, or one channel a group: the output is x itself, read-only (else the graph
    would run an in-place step over it, and over whatever else reads x)."""
    x = rand(1, 6, 2, 2)
    (y,) = make_layer("nn.ChannelShuffle", {"groups": groups}).forward([x])
    np.testing.assert_array_equal(y, x)
    assert not (np.shares_memory(x, y) and y.flags.writeable)


def test_channel_shuffle_groups_as_a_second_input():
    """F.channel_shuffle(x, g) is written aten::channel_shuffle, g from a pnnx.Expression."""
    x = rand(2, 6, 3, 4)
    layer = make_layer("aten::channel_shuffle")
    (y,) = layer.forward([x, np.array(3)])
    np.testing.assert_array_equal(y, torch.channel_shuffle(torch.from_numpy(x), 3).numpy())
    assert layer.infer_shapes_from([x.shape, ()], [None, np.array(3)]) == [x.shape]


@pytest.mark.parametrize("groups, shape, message", [
    (4, (1, 6, 3, 3), "6 channels cannot be split into 4 groups"),
    (2, (2, 6), "rank > 2"),
    (0, (1, 6, 3, 3), "groups must be positive"),
])
def test_channel_shuffle_errors(groups, shape, message):
    layer = make_layer("nn.ChannelShuffle", {"groups": groups})
    with pytest.raises((ShapeError, LayerError), match=message):
        layer.infer_shapes([shape])


# ----- aten::movedim, aten::tril / aten::triu ---------------------------------------------------

class MoveAndMask(nn.Module):
    def forward(self, x):
        return (torch.movedim(x, 1, -1), x.movedim((0, 1), (2, 3)), torch.movedim(x, -1, 0),
                torch.tril(x), x.triu(1), torch.tril(x[0, 0], -2), torch.triu(x, diagonal=-1))


def test_pnnx_export_of_movedim_tril_and_triu_matches_torch(pnnx_export):
    check_export(pnnx_export, MoveAndMask(), [(2, 3, 4, 5)], "move_and_mask",
                 ["aten::movedim", "aten::tril", "aten::triu"])


def test_movedim_and_tril_refuse_bad_arguments():
    with pytest.raises(ShapeError, match="different numbers of dims"):
        make_layer("aten::movedim").infer_shapes_from(
            [(2, 3, 4), (2,), ()], [None, np.array([0, 1]), np.array(2)])
    with pytest.raises(ShapeError, match="dim 3"):
        make_layer("aten::movedim").infer_shapes_from(
            [(2, 3, 4), (), ()], [None, np.array(3), np.array(0)])
    with pytest.raises(ShapeError, match="rank 2 or more"):
        make_layer("aten::tril").infer_shapes([(5,), ()])


def test_repeat_interleave_checks_output_size_as_torch():
    layer = make_layer("torch.repeat_interleave", {"repeats": 2, "dim": 0, "output_size": 5})
    with pytest.raises(ShapeError, match="output_size=5, but the repeats make 4"):
        layer.infer_shapes_from([(2, 3)], [None])
