"""The two pnnx mis-exports infer/rewrite.py mends, on hand-written files: when each mend
applies (and gives torch's answer), and when it must not."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from support import write_model
from infer import RuntimeGraph
from parser.errors import GraphError, ShapeError


def folded_pixel_shuffle(tmp_path, input_shape):
    return RuntimeGraph(*write_model(
        tmp_path, f"pnnx.Input in0 0 1 a #a=({','.join(map(str, input_shape))})f32",
        "nn.PixelShuffle ps 1 1 a b upscale_factor=2 #b=(1,2,4,6)f32",
        "pnnx.Output out0 1 0 b")).build()


@pytest.mark.parametrize("input_shape", [(1, 2, 4, 6), (1, 8, 6)], ids=str)
def test_a_pixel_shuffle_on_fold_patches_is_the_fold_at_any_batch(tmp_path, input_shape):
    """(B, C, r*r, L) or (B, C*r*r, L) patches into a (B, C, H, W) image, as F.fold with
    kernel = stride = r computes it; the batch is free."""
    graph = folded_pixel_shuffle(tmp_path, input_shape)
    for batch in (1, 3):
        x = np.random.default_rng(batch).standard_normal((batch, *input_shape[1:]))
        x = x.astype(np.float32)
        want = F.fold(torch.from_numpy(x).reshape(batch, 8, 6), (4, 6), 2, stride=2)
        np.testing.assert_array_equal(graph.forward(x)[0], want.numpy())


def test_a_pixel_shuffle_on_other_shapes_is_not_mended(tmp_path):
    """The same number of values in another layout: the annotation check refuses it."""
    with pytest.raises(ShapeError, match=r"annotated \(1, 2, 4, 6\) but nn.PixelShuffle ps"):
        folded_pixel_shuffle(tmp_path, (1, 48, 1, 1))


CONV = ("nn.Conv2d conv 3 1 w b x y bias=True dilation=(1,1) groups=2 in_channels=2 "
        "kernel_size=(3,3) out_channels=2 padding=(1,1) padding_mode=zeros stride=(1,1) "
        "@bias=(2)f32 @weight=(2,1,3,3)f32 #w=(2,1,3,3)f32 #b=(2)f32 #x=(1,2,5,5)f32 "
        "#y=(1,2,5,5)f32")


def shared_conv(tmp_path, copy_of_weight):
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((2, 1, 3, 3)).astype(np.float32)
    bias = rng.standard_normal(2).astype(np.float32)
    weights = {"conv.weight": weight, "conv.bias": bias, "wa.data": copy_of_weight(weight),
               "ba.data": bias}
    graph = RuntimeGraph(*write_model(
        tmp_path, "pnnx.Input in0 0 1 x #x=(1,2,5,5)f32",
        "pnnx.Attribute wa 0 1 w @data=(2,1,3,3)f32 #w=(2,1,3,3)f32",
        "pnnx.Attribute ba 0 1 b @data=(2)f32 #b=(2)f32", CONV, "pnnx.Output out0 1 0 y",
        weights=weights))
    return graph, weight, bias


def test_a_module_reading_copies_of_its_weights_reads_only_its_input(tmp_path):
    graph, weight, bias = shared_conv(tmp_path, lambda w: w)
    x = np.random.default_rng(1).standard_normal((1, 2, 5, 5)).astype(np.float32)
    want = F.conv2d(torch.from_numpy(x), torch.from_numpy(weight), torch.from_numpy(bias),
                    padding=1, groups=2)
    np.testing.assert_allclose(graph.build().forward(x)[0], want.numpy(), atol=1e-6)
    assert [op.type for op in graph.operators] == ["pnnx.Input", "nn.Conv2d", "pnnx.Output"]


def test_inputs_shaped_as_the_weights_but_holding_other_values_are_refused(tmp_path):
    graph, _, _ = shared_conv(tmp_path, lambda w: w + 1)
    with pytest.raises(GraphError, match=r"nn.Conv2d conv reads pnnx.Attribute wa \(line 4\) "
                                         r"as an input, shaped as one of its weights but "
                                         r"holding other values; a nn.Conv2d takes one input"):
        graph.build()
