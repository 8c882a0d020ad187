"""3-D layers (layers/volume.py) against torch: Conv3d (padding modes, 'same', groups,
dilation, unbatched), MaxPool3d / AvgPool3d (padding, ceil_mode, count_include_pad,
divisor_override), AdaptiveAvgPool3d (bins that overlap), BatchNorm3d, and a pnnx export."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from helpers import check_export, check_layer, make_layer, rand
from parser.errors import LayerError, ShapeError

X = (2, 4, 7, 9, 8)


def conv_params(module: nn.Conv3d) -> dict:
    padding = module.padding if isinstance(module.padding, str) else tuple(module.padding)
    return dict(in_channels=module.in_channels, out_channels=module.out_channels,
                kernel_size=tuple(module.kernel_size), stride=tuple(module.stride),
                padding=padding, dilation=tuple(module.dilation), groups=module.groups,
                bias=module.bias is not None, padding_mode=module.padding_mode)


CONVS = {
    "3x3x3 pad 1": dict(kernel_size=3, padding=1),
    "stride (1,2,2) dilation 2": dict(kernel_size=3, stride=(1, 2, 2), dilation=(2, 1, 2)),
    "same, even kernel": dict(kernel_size=(2, 4, 3), padding="same"),
    "groups 2, no bias": dict(kernel_size=(3, 1, 1), padding=(1, 0, 0), groups=2, bias=False),
    "reflect": dict(kernel_size=3, padding=1, padding_mode="reflect"),
    "replicate": dict(kernel_size=(3, 1, 3), padding=(1, 0, 1), padding_mode="replicate"),
    "circular": dict(kernel_size=3, padding=(2, 1, 1), padding_mode="circular"),
}


@pytest.mark.parametrize("options", CONVS.values(), ids=CONVS.keys())
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
def test_conv3d_matches_torch(options, batched):
    torch.manual_seed(0)
    module = nn.Conv3d(4, 6, **options).eval()
    weights = {name: p.detach().numpy() for name, p in module.named_parameters()}
    check_layer("nn.Conv3d", module, [X if batched else X[1:]], conv_params(module), weights)


def test_f_conv3d_takes_weight_and_bias_as_inputs():
    check_layer("F.conv3d", lambda x, w, b: F.conv3d(x, w, b, stride=2, padding=1, groups=2),
                [X, (6, 2, 3, 3, 2), (6,)], dict(stride=2, padding=1, groups=2))


POOLS = {
    "max 2": (nn.MaxPool3d(2), dict(kernel_size=2)),
    "max pad ceil dilation": (nn.MaxPool3d(3, stride=2, padding=1, dilation=(1, 2, 1),
                                           ceil_mode=True),
                              dict(kernel_size=3, stride=2, padding=1, dilation=(1, 2, 1),
                                   ceil_mode=True)),
    "avg pad ceil": (nn.AvgPool3d(3, stride=2, padding=1, ceil_mode=True),
                     dict(kernel_size=3, stride=2, padding=1, ceil_mode=True)),
    "avg exclude pad": (nn.AvgPool3d((2, 3, 3), stride=(1, 2, 2), padding=(1, 1, 0),
                                     count_include_pad=False, ceil_mode=True),
                        dict(kernel_size=(2, 3, 3), stride=(1, 2, 2), padding=(1, 1, 0),
                             count_include_pad=False, ceil_mode=True)),
    "avg divisor": (nn.AvgPool3d(2, divisor_override=3), dict(kernel_size=2, divisor_override=3)),
}


@pytest.mark.parametrize("case", POOLS.values(), ids=POOLS.keys())
def test_pool3d_matches_torch(case):
    module, params = case
    kind = "nn.MaxPool3d" if isinstance(module, nn.MaxPool3d) else "nn.AvgPool3d"
    x = rand(*X)
    x[0, 1, 2, 3, 4] = np.nan                              # NaN wins max pooling, as in torch
    check_layer(kind, module, [x], params)


@pytest.mark.parametrize("size", [1, (3, 4, 5), (None, 2, 3), (7, 9, 8)], ids=str)
def test_adaptive_avg_pool3d_matches_torch(size):
    check_layer("nn.AdaptiveAvgPool3d", nn.AdaptiveAvgPool3d(size), [X],
                {"output_size": size})


def test_batchnorm3d_matches_torch():
    torch.manual_seed(0)
    module = nn.BatchNorm3d(4).eval()
    with torch.no_grad():
        module.running_mean.uniform_(-1, 1)
        module.running_var.uniform_(0.5, 2)
        module.weight.uniform_(0.5, 1.5)
    weights = {k: v.detach().numpy() for k, v in module.state_dict().items()
               if k != "num_batches_tracked"}
    check_layer("nn.BatchNorm3d", module, [X], {"num_features": 4}, weights)


class Video(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv3d(3, 8, 3, stride=(1, 2, 2), padding=1)
        self.pool = nn.MaxPool3d((1, 2, 2))
        self.bn = nn.BatchNorm3d(8)                        # after the pool: not folded
        self.conv2 = nn.Conv3d(8, 8, (3, 1, 1), padding=(1, 0, 0), groups=2, bias=False,
                               padding_mode="replicate")
        self.avg = nn.AvgPool3d(2, stride=1)
        self.head = nn.AdaptiveAvgPool3d(1)

    def forward(self, x):
        y = torch.relu(self.bn(self.pool(self.conv(x))))
        functional = (F.max_pool3d(y, 2, padding=1), F.avg_pool3d(y, (1, 2, 2), ceil_mode=True),
                      F.adaptive_avg_pool3d(y, (2, 1, 3)))
        return (self.head(self.avg(self.conv2(y))).flatten(1), *functional)


def test_pnnx_export_of_a_small_video_network_matches_torch(pnnx_export):
    torch.manual_seed(0)
    module = Video().eval()
    with torch.no_grad():
        module.bn.running_mean.uniform_(-0.5, 0.5)
        module.bn.running_var.uniform_(0.5, 2)
    check_export(pnnx_export, module, [(1, 3, 6, 10, 12)], "video",
                 ["nn.Conv3d", "nn.MaxPool3d", "nn.BatchNorm3d", "nn.AvgPool3d",
                  "nn.AdaptiveAvgPool3d", "F.max_pool3d", "F.avg_pool3d",
                  "F.adaptive_avg_pool3d"])


def test_bad_3d_arguments_are_refused():
    with pytest.raises(ShapeError, match=r"\(N, C, D, H, W\)"):
        make_layer("nn.MaxPool3d", {"kernel_size": 2}).infer_shapes([(2, 3, 4)])
    with pytest.raises(ShapeError, match="does not fit"):
        make_layer("nn.AvgPool3d", {"kernel_size": 3, "ceil_mode": True}).infer_shapes(
            [(1, 1, 2, 2, 2)])
    with pytest.raises(LayerError, match="return_indices"):
        make_layer("nn.MaxPool3d", {"kernel_size": 2, "return_indices": True})
    with pytest.raises(LayerError, match="padding_mode"):
        make_layer("nn.Conv3d", dict(in_channels=2, out_channels=2, kernel_size=3,
                                     padding_mode="mirror"))
