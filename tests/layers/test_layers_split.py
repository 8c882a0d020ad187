"""Slicing, joining and splitting layers against torch: Tensor.slice (single and fused, with
bounds computed in the graph), pnnx.SliceIndexes, select, narrow, cat, stack, split / chunk /
tensor_split / unbind (several outputs), index_select and gather."""

import numpy as np
import pytest
import torch

from torch import nn

from helpers import check_export, check_layer, make_layer, rand
from support import case_id, write_model
from infer import RuntimeGraph
from layers import LayerRegisterer
from layers import split as split_layers
from parser.errors import LayerError, ShapeError

INT_MAX = 2147483647


def named_layer(type_name, params, input_names):
    """A layer built as the graph builds it for a line with ``$name=`` inputs."""
    layer = make_layer(type_name, params)
    layer.input_names = list(input_names)
    return layer


# ----- slice ------------------------------------------------------------------------------------

@pytest.mark.parametrize("dim, start, end, step", [
    (1, 1, INT_MAX, 1), (1, 0, INT_MAX, 2), (2, -3, -1, 1), (2, 2, 100, 1), (2, -100, 3, 1),
    (-1, 1, -1, 3), (0, 1, 1, 1), (2, 7, 2, 1), (1, -1, INT_MAX, 1), (2, 0, 9, 4)], ids=str)
def test_slice_matches_torch(dim, start, end, step):
    index = (slice(None),) * (dim % 3) + (slice(start, end, step),)
    check_layer("Tensor.slice", lambda t: t[index], [(2, 3, 10)],
                {"dim": dim, "start": start, "end": end, "step": step})


@pytest.mark.parametrize("params, index", [
    ({"dims": (1, 2), "starts": (1, 0), "ends": (3, INT_MAX), "steps": (1, 3)},
     (slice(None), slice(1, 3), slice(0, None, 3))),
    ({"dims": (0, -1), "starts": (1, -4), "ends": (2, -1), "steps": (1, 2)},
     (slice(1, 2), Ellipsis, slice(-4, -1, 2))),
    ({"dims": (1, 2), "starts": (0, 0), "ends": (0, 0), "steps": (0, 0),
      "selects": (-1, 4)}, (slice(None), -1, 4)),
    ({"dims": (1, 2), "starts": (0, 2), "ends": (0, 8), "steps": (0, 2),
      "selects": (0, INT_MAX)}, (slice(None), 0, slice(2, 8, 2))),
], ids=["slices", "negative dims", "two selects", "select and slice"])
def test_fused_slice_matches_torch(params, index):
    """pnnx fuses x[:, 1:3, ::3] into one Tensor.slice with lists; a select in the list
    removes that dim."""
    check_layer("Tensor.slice", lambda t: t[index], [(2, 3, 10)], params)


def test_slice_with_a_computed_end():
    # x[:, :, :x.size(2) // 2] -> Tensor.slice dim=2 start=0 step=1 $input=0 $end=1
    layer = named_layer("Tensor.slice", {"dim": 2, "start": 0, "step": 1}, ["input", "end"])
    x = rand(2, 3, 10)
    assert layer.infer_shapes_from([x.shape, ()], [None, np.array(5)]) == [(2, 3, 5)]
    (y,) = layer.forward([x, np.array(5)])
    np.testing.assert_array_equal(y, x[:, :, :5])
    with pytest.raises(ShapeError, match="not known before the graph runs"):
        layer.infer_shapes([x.shape, ()])


def test_fused_slice_with_computed_bounds_from_slice_indexes():
    """pnnx.SliceIndexes builds the bounds list: indexes=(@0,0) is input 0's value, then 0."""
    starts = make_layer("pnnx.SliceIndexes", {"indexes": ("@0", "0")})
    ends = make_layer("pnnx.SliceIndexes", {"indexes": (str(INT_MAX), "@0")})
    (start_values,) = starts.infer_values([()], [np.array(2)])
    (end_values,) = ends.forward([np.array(5)])
    np.testing.assert_array_equal(start_values, [2, 0])
    assert starts.infer_shapes([()]) == [(2,)] and start_values.dtype == np.int64
    layer = named_layer("Tensor.slice", {"dims": (1, 2), "steps": (1, 1),
                                         "selects": (INT_MAX, INT_MAX)},
                        ["input", "starts", "ends"])
    x = rand(2, 4, 10)
    assert layer.infer_shapes_from([x.shape, (2,), (2,)], [None, start_values, end_values]) \
        == [(2, 2, 5)]
    (y,) = layer.forward([x, start_values, end_values])
    np.testing.assert_array_equal(y, x[:, 2:, :5])


def test_computed_select_in_a_fused_slice():
    # x[:, -1, x.size(2) // 3] -> $selects from SliceIndexes indexes=(-1,@0)
    selects = make_layer("pnnx.SliceIndexes", {"indexes": ("-1", "@0")}).forward(
        [np.array(3)])[0]
    layer = named_layer("Tensor.slice", {"dims": (1, 2), "starts": (0, 0), "ends": (0, 0),
                                         "steps": (0, 0)}, ["input", "selects"])
    x = rand(2, 4, 10)
    (y,) = layer.forward([x, selects])
    np.testing.assert_array_equal(y, x[:, -1, 3])


@pytest.mark.parametrize("params", [
    {"dim": 1, "start": 0, "end": 2, "step": 0}, {"dim": 3, "start": 0, "end": 1, "step": 1},
    {"dims": (1,), "selects": (3,)}, {"dims": (1, 2), "starts": (0,)}, {},
], ids=str)
def test_bad_slices_are_errors(params):
    with pytest.raises((ShapeError, LayerError)):
        make_layer("Tensor.slice", params).infer_shapes([(2, 3, 10)])


def test_slice_indexes_refuses_what_is_not_an_index():
    with pytest.raises(LayerError, match="neither a number nor @N"):
        make_layer("pnnx.SliceIndexes", {"indexes": ("@0", "x")})
    with pytest.raises(ShapeError, match="refers to input 1"):
        make_layer("pnnx.SliceIndexes", {"indexes": ("@1",)}).infer_shapes([()])


# ----- select / narrow --------------------------------------------------------------------------

@pytest.mark.parametrize("dim, index", [(0, 1), (1, -1), (2, -2), (-1, 0)], ids=str)
def test_select_matches_torch(dim, index):
    check_layer("Tensor.select", lambda t: t.select(dim, index), [(2, 3, 10)],
                {"dim": dim, "index": index})


def test_select_of_a_vector_gives_a_0d_array_and_a_computed_index_works():
    check_layer("Tensor.select", lambda t: t.select(0, 2), [(4,)], {"dim": 0, "index": 2})
    layer = named_layer("Tensor.select", {"dim": 1}, ["input", "index"])
    x = rand(2, 3, 4)
    (y,) = layer.forward([x, np.array(2)])
    np.testing.assert_array_equal(y, x[:, 2])


def test_select_out_of_range_is_a_shape_error():
    with pytest.raises(ShapeError, match="out of range"):
        make_layer("Tensor.select", {"dim": 1, "index": 3}).infer_shapes([(2, 3, 4)])


@pytest.mark.parametrize("dim, start, length", [(1, 1, 2), (2, 0, 10), (-1, -4, 3), (0, 2, 0)],
                         ids=str)
def test_narrow_matches_torch(dim, start, length):
    check_layer("torch.narrow", lambda t: torch.narrow(t, dim, start, length), [(2, 3, 10)],
                {"dim": dim, "start": start, "length": length})


def test_narrow_past_the_end_is_a_shape_error():
    with pytest.raises(ShapeError, match="does not fit"):
        make_layer("torch.narrow", {"dim": 1, "start": 2, "length": 2}).infer_shapes([(2, 3)])


# ----- cat / stack ----------------------------------------------------------------------------

@pytest.mark.parametrize("dim, shapes", [
    (1, [(2, 3, 4), (2, 5, 4)]), (0, [(1, 3), (2, 3), (3, 3)]), (-1, [(2, 3, 1), (2, 3, 4)]),
    (2, [(1, 2, 3, 4)]), (-3, [(2, 3, 4), (2, 3, 4)]),
], ids=str)
def test_cat_matches_torch(dim, shapes):
    check_layer("torch.cat", lambda *ts: torch.cat(ts, dim), shapes, {"dim": dim})


def test_cat_writes_into_a_given_buffer_as_torch():
    xs = [rand(2, 3, 4), rand(2, 5, 4), rand(2, 1, 4)]
    layer = make_layer("torch.cat", {"dim": -2})
    out = np.full((2, 9, 4), np.nan, np.float32)
    layer.forward_into(xs, [out])                    # the graph's way, into its buffer
    np.testing.assert_array_equal(out, torch.cat([torch.from_numpy(x) for x in xs], 1).numpy())
    with pytest.raises(ShapeError, match="other dims must match"):
        layer.forward_into([xs[0], rand(3, 3, 4)], [out])


@pytest.mark.parametrize("batch", [1, 2])
def test_cat_copies_only_the_inputs_not_already_in_their_piece(batch):
    """The memory plan may have an input's producer write it into its piece of the output
    (batch 1: each piece is contiguous): the cat leaves it there and copies the others. An
    array over the same memory with another layout is an input like any other."""
    layer = make_layer("torch.cat", {"dim": 1})
    pieces = [rand(batch, 2, 3), rand(batch, 1, 3), rand(batch, 3, 3), rand(batch, 2, 3)]
    out = np.full((batch, 8, 3), np.nan, np.float32)
    placed = out[:, 3:6]
    placed[...] = pieces[2]
    layer.forward_into([pieces[0], pieces[1], placed, pieces[3]], [out])
    np.testing.assert_array_equal(out, np.concatenate(pieces, 1))
    # the last piece's memory, read column by column: same start, another layout
    swapped = np.lib.stride_tricks.as_strided(out[:, 6:], (batch, 2, 3), (out.strides[0], 4, 8))
    want = np.concatenate([pieces[0], pieces[1], pieces[2], swapped.copy()], 1)
    layer.forward_into([pieces[0], pieces[1], placed, swapped], [out])
    np.testing.assert_array_equal(out, want)
    with pytest.raises(ShapeError, match=r"the given array is \(%d, 9, 3\)" % batch):
        layer.forward_into(pieces, [np.empty((batch, 9, 3), np.float32)])


def test_cat_of_mismatched_shapes_is_a_shape_error():
    with pytest.raises(ShapeError, match=r"\(2, 3, 4\), \(2, 3, 5\)"):
        make_layer("torch.cat", {"dim": 1}).infer_shapes([(2, 3, 4), (2, 3, 5)])
    with pytest.raises(ShapeError, match="out of range"):
        make_layer("torch.cat", {"dim": 3}).infer_shapes([(2, 3, 4), (2, 3, 4)])


@pytest.mark.parametrize("dim, count", [(0, 2), (1, 3), (-1, 2), (3, 1), (-4, 2)], ids=str)
def test_stack_matches_torch(dim, count):
    check_layer("torch.stack", lambda *ts: torch.stack(ts, dim), [(2, 3, 4)] * count,
                {"dim": dim})


def test_stack_of_different_shapes_is_a_shape_error():
    with pytest.raises(ShapeError, match="must be equal"):
        make_layer("torch.stack", {"dim": 0}).infer_shapes([(2, 3), (2, 4)])


# ----- split / chunk / tensor_split / unbind ------------------------------------------------

@pytest.mark.parametrize("sizes, dim", [(3, 2), (5, -1), (10, 2), (20, 2), ((2, 5, 3), -1),
                                        ((1, 2), 1), ((0, 10), 2), (1, 0)], ids=str)
def test_split_matches_torch(sizes, dim):
    check_layer("torch.split", lambda t: torch.split(t, sizes, dim), [(2, 3, 10)],
                {"split_size_or_sections": sizes, "dim": dim})


def test_split_sizes_that_do_not_add_up_are_a_shape_error():
    with pytest.raises(ShapeError, match="add up"):
        make_layer("torch.split", {"split_size_or_sections": (2, 5), "dim": 2}).infer_shapes(
            [(2, 3, 10)])


@pytest.mark.parametrize("chunks, dim, size", [(3, 2, 10), (2, 1, 3), (3, 0, 4), (5, 0, 4),
                                               (1, -1, 7), (4, -1, 8)], ids=str)
def test_chunk_matches_torch(chunks, dim, size):
    """torch.chunk can return fewer pieces than asked (4 in 3 chunks: 2 + 2)."""
    shape = [2, 3, 5]
    shape[dim] = size
    check_layer("torch.chunk", lambda t: torch.chunk(t, chunks, dim), [tuple(shape)],
                {"chunks": chunks, "dim": dim})


@pytest.mark.parametrize("params, torch_arg", [
    ({"sections": 3, "dim": 2}, 3), ({"sections": 4, "dim": 1}, 4),
    ({"indices": (1, 4), "dim": -1}, [1, 4]), ({"indices": (4, 1), "dim": 2}, [4, 1]),
    ({"indices": (-3, 20), "dim": 2}, [-3, 20]), ({"indices": (0,), "dim": 0}, [0]),
], ids=str)
def test_tensor_split_matches_torch(params, torch_arg):
    check_layer("torch.tensor_split", lambda t: torch.tensor_split(t, torch_arg, params["dim"]),
                [(2, 3, 10)], params)


@pytest.mark.parametrize("dim", [0, 1, -1], ids=str)
def test_unbind_matches_torch(dim):
    check_layer("torch.unbind", lambda t: torch.unbind(t, dim), [(2, 3, 4)], {"dim": dim})


def test_pieces_are_read_only_views():
    x = rand(2, 3, 10)
    pieces = make_layer("torch.chunk", {"chunks": 2, "dim": 2}).forward([x])
    assert all(np.shares_memory(p, x) and not p.flags.writeable for p in pieces)


# ----- index_select / gather ------------------------------------------------------------------

@pytest.mark.parametrize("dim, index", [(1, [2, 0]), (-1, [4, 4, 1]), (0, [1])], ids=str)
def test_index_select_matches_torch(dim, index):
    index = np.array(index, np.int64)
    check_layer("torch.index_select", lambda t, i: torch.index_select(t, dim, i),
                [(2, 3, 5), index], {"dim": dim})


def test_index_select_out_of_range_is_a_shape_error():
    layer = make_layer("torch.index_select", {"dim": 1})
    with pytest.raises(ShapeError, match="outside"):
        layer.forward([rand(2, 3), np.array([3])])


@pytest.mark.parametrize("dim, index_shape", [(2, (2, 3, 4)), (0, (1, 3, 5)), (-2, (2, 2, 3))],
                         ids=str)
def test_gather_matches_torch(dim, index_shape):
    size = (2, 3, 5)[dim]
    index = np.random.default_rng(1).integers(0, size, index_shape)
    check_layer("torch.gather", lambda t, i: torch.gather(t, dim, i), [(2, 3, 5), index],
                {"dim": dim})


def test_gather_with_a_too_large_index_is_a_shape_error():
    with pytest.raises(ShapeError, match="does not fit"):
        make_layer("torch.gather", {"dim": 0}).infer_shapes([(2, 3), (2, 4)])


# ----- slice_copy (assignment into a slice) -----------------------------------------------------

def assigned(index):
    """torch's assignment into a slice: (x, src) -> y = x.clone(); y[index] = src."""

    def run(x, src):
        y = x.clone()
        y[index] = src
        return y

    return run


@pytest.mark.parametrize("params, index, src_shape", [
    ({"dim": 1, "start": 1, "end": 3, "step": 1}, (slice(None), slice(1, 3)), (2, 2, 10)),
    ({"dim": -1, "start": 0, "end": 2, "step": 1}, (Ellipsis, slice(0, 2)), (2, 3, 2)),
    ({"dim": 2, "start": 1, "end": INT_MAX, "step": 3},
     (slice(None), slice(None), slice(1, None, 3)), (1, 3, 1)),
    ({"dim": 1, "end": 0, "select": -1, "start": 0, "step": 0}, (slice(None), -1), (2, 10)),
    ({"dims": (0, 2), "starts": (0, 0), "ends": (0, 0), "steps": (0, 0), "selects": (1, 2)},
     (1, slice(None), 2), (3,)),
    ({"dims": (1, 2), "starts": (0, -4), "ends": (2, INT_MAX), "steps": (1, 2),
      "selects": (INT_MAX, INT_MAX)}, (slice(None), slice(0, 2), slice(-4, None, 2)), (2, 2, 2)),
], ids=["slice", "last dim", "step, broadcast src", "select", "two selects", "fused slices"])
def test_slice_copy_matches_torch_assignment(params, index, src_shape):
    layer = named_layer("Tensor.slice_copy", params, ["self", "src"])
    x, src = rand(2, 3, 10), rand(*src_shape)
    want = assigned(index)(torch.from_numpy(x.copy()), torch.from_numpy(src.copy()))
    assert layer.infer_shapes([x.shape, src.shape]) == [x.shape]
    (y,) = layer.forward([x, src])
    np.testing.assert_array_equal(y, want.numpy())
    assert not np.shares_memory(y, x)


def test_slice_copy_with_a_computed_end_and_a_bad_src():
    # x[:, :, :x.size(2) // 2] = src -> $self=0 $src=1 $end=2
    layer = named_layer("Tensor.slice_copy", {"dim": 2, "start": 0, "step": 1},
                        ["self", "src", "end"])
    x, src = rand(2, 3, 10), rand(2, 3, 5)
    (y,) = layer.forward([x, src, np.array(5)])
    np.testing.assert_array_equal(y[:, :, :5], src)
    np.testing.assert_array_equal(y[:, :, 5:], x[:, :, 5:])
    with pytest.raises(ShapeError, match="cannot be assigned"):
        layer.infer_shapes_from([x.shape, (2, 3, 4), ()], [None, None, np.array(5)])


class SetItems(nn.Module):
    """In-place assignments as YOLOv5's Detect (inplace=True) and masking code write them."""

    def forward(self, x):
        y = x.sigmoid()
        y[..., 0:2] = (y[..., 0:2] * 2 - 0.5) * 8
        y[..., 2:4] = (y[..., 2:4] * 2) ** 2
        y[:, -1] = y[:, 0] + 1
        y[0, :, 2] = 7
        y[:, 1:3, 1::2, -3:] = 0.5
        return y


def test_pnnx_export_of_assignments_into_slices(pnnx_export):
    check_export(pnnx_export, SetItems(), [(2, 4, 5, 7)], "slice_copy", ["Tensor.slice_copy"])


@pytest.mark.parametrize("type_name, layer_class", [
    ("Tensor.slice", split_layers.Slice), ("Tensor.slice_copy", split_layers.SliceCopy),
    ("pnnx.SliceIndexes", split_layers.SliceIndexes),
    ("Tensor.select", split_layers.Select), ("torch.narrow", split_layers.Narrow),
    ("torch.cat", split_layers.Cat), ("torch.stack", split_layers.Stack),
    ("torch.split", split_layers.Split), ("torch.chunk", split_layers.Chunk),
    ("torch.tensor_split", split_layers.TensorSplit), ("torch.unbind", split_layers.Unbind),
    ("torch.index_select", split_layers.IndexSelect), ("torch.gather", split_layers.Gather)])
def test_registered_under_pnnx_names(type_name, layer_class):
    assert LayerRegisterer().layer_class(type_name) is layer_class


# ----- x[index] (aten::index) ------------------------------------------------------------------

class AdvancedIndexing(nn.Module):
    """MViT-v2's relative positions: a table indexed by integer tensors, computed (here: an
    input) or constant (pnnx folds them into the operator's ``expr``)."""

    def forward(self, x, rows):
        cols = torch.tensor([0, 2, -1])
        return (x[rows], x[:, rows.flatten()], x[rows, rows - 1], x[cols], x[:, cols],
                x[cols, cols], x[:, :, cols])


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_pnnx_export_of_advanced_indexing_matches_torch(pnnx_export):
    rows = np.array([[2, 1, 0], [3, 2, 1], [4, 3, 2], [1, 0, 3]], np.int64)
    check_export(pnnx_export, AdvancedIndexing(), [(6, 5, 3), rows], "advanced_indexing",
                 ["Tensor.index"])


def test_indices_pnnx_folded_into_a_wrong_list_are_refused_by_the_annotation(tmp_path):
    """pnnx writes a folded 2-D index tensor as its first row only (``x[rows]`` with rows of
    shape (4, 3) comes out as ``expr=[[2,1,0,3]]`` annotated (4, 3, 5, 3)): the annotation
    check names the operator rather than letting a wrong answer through."""
    param, binary = write_model(
        tmp_path, "pnnx.Input in0 0 1 0 #0=(6,5,3)f32",
        "Tensor.index ix 1 1 0 1 expr=[[2,1,0,3]] #0=(6,5,3)f32 #1=(4,3,5,3)f32",
        "pnnx.Output out0 1 0 1")
    with pytest.raises(ShapeError, match=r"annotated \(4, 3, 5, 3\) but Tensor.index ix "
                                         r"computes \(4, 5, 3\)"):
        RuntimeGraph(param, binary).build()


class MaskIndexing(nn.Module):
    """Masks: a constant one (pnnx folds it into ``expr``) and one computed from x, whose
    count of True values is known only while the graph runs."""

    def __init__(self, computed: bool):
        super().__init__()
        self.computed = computed

    def forward(self, x):
        if self.computed:
            return x[x[:, 0, 0] > 0]
        return x[:, torch.tensor([True, False, True])], x[torch.tensor([True] * 6)]


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")
def test_a_constant_mask_picks_what_torch_picks(pnnx_export):
    check_export(pnnx_export, MaskIndexing(computed=False), [(6, 3, 2)], "constant_mask",
                 ["Tensor.index"])


def test_a_computed_mask_is_refused_at_build_as_a_data_dependent_shape(pnnx_export):
    param, binary = pnnx_export(MaskIndexing(computed=True), (torch.rand(6, 3, 2) - 0.5,),
                                "computed_mask")
    with pytest.raises(ShapeError, match=r"x\[mask\]: how many elements the bool mask"):
        RuntimeGraph(param, binary).build()


def test_a_uint8_index_is_a_mask_as_in_torch():
    x = rand(4, 3)
    index = np.array([1, 0, 0, 1], np.uint8)
    want = torch.from_numpy(x)[torch.from_numpy(index).bool()].numpy()
    np.testing.assert_array_equal(make_layer("Tensor.index").forward([x, index])[0], want)


def test_indices_that_mix_masks_and_integers_are_refused():
    with pytest.raises(LayerError, match="mixes True / False with integers"):
        make_layer("Tensor.index", {"expr": "[[True,1]]"})


@pytest.mark.parametrize("index_shapes, message", [
    ([(2,), (3,)], "shape mismatch"), ([(2,)] * 4, "4 indices"),
], ids=case_id)
def test_index_refuses_indices_that_do_not_fit(index_shapes, message):
    layer = make_layer("Tensor.index")
    with pytest.raises(ShapeError, match=message):
        layer.infer_shapes_from([(6, 5, 3), *index_shapes], [None] * (1 + len(index_shapes)))


def test_index_out_of_range_is_a_shape_error():
    x, index = np.zeros((4, 2), np.float32), np.array([0, 4])
    with pytest.raises(ShapeError, match=r"index 4 is out of bounds"):
        make_layer("Tensor.index").forward([x, index])
