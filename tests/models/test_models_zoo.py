"""The model families people bring, each written here with its real block structure (width-
reduced, small inputs, seeded random weights and BatchNorm statistics, eval mode), exported
once with pnnx and compared with torch within 1e-4 absolute or 1e-3 relative:

    MobileNetV2           inverted residuals, ReLU6, depthwise convolutions
    MobileNetV3-small     squeeze-and-excitation, hardswish, hardsigmoid
    YOLOv5s-style         6x6 stem, C3, SPPF, upsample + concat, Detect decode on a grid
    UNet                  transposed convolutions, skip concats, bilinear upsampling
    ViT (two blocks)      patch conv, class token, LayerNorm, attention, GELU MLP
    two inputs, three outputs   an RGB + depth network with class, mask and embedding heads
"""

from __future__ import annotations


import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from infer import RuntimeGraph
from infer.export import randomize
from support import assert_plan_sound

pytestmark = pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning")

ATOL, RTOL = 1e-4, 1e-3


def make_divisible(value: float, divisor: int = 8) -> int:
    """torchvision's _make_divisible: round channels to a multiple of 8, losing <= 10 %."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def seeded(model: nn.Module, seed: int = 0) -> nn.Module:
    """Seeded random weights (torch's default init under a fixed seed), random biases where
    torch starts them at zero, random BatchNorm statistics: every parameter matters."""
    torch.manual_seed(seed)
    for module in model.modules():
        if hasattr(module, "reset_parameters") and not isinstance(module, nn.modules.batchnorm
                                                                  ._BatchNorm):
            module.reset_parameters()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "token" in name or "pos" in name:
                parameter.normal_(0, 0.1)
    return randomize(model, seed).eval()


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Every element within ATOL absolute or RTOL relative of torch's."""
    assert got.shape == want.shape, f"{what}: shape {got.shape}, torch {want.shape}"
    error = np.abs(got.astype(np.float64) - want)
    bad = (error > ATOL) & (error > RTOL * np.abs(want))
    assert not bad.any(), (f"{what}: {bad.sum()} of {bad.size} values differ; worst absolute "
                           f"error {error.max():.3g}")


def check_model(pnnx_export, model: nn.Module, inputs: list[torch.Tensor], name: str
                ) -> RuntimeGraph:
    """Export ``model`` (once per session), run the files, compare every output with torch;
    the graph for more checks."""
    param, binary = pnnx_export(model, tuple(inputs), name)
    graph = RuntimeGraph(param, binary).build()
    with torch.no_grad():
        want = model(*inputs)
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    got = graph.forward(*(x.numpy() for x in inputs))
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w.numpy(), f"{name} output {index}")
    return graph


def image(*shape: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


# ================================================================ MobileNetV2

class ConvBNAct(nn.Sequential):
    """Conv2d (no bias) + BatchNorm2d + activation: torchvision's Conv2dNormActivation."""

    def __init__(self, cin: int, cout: int, kernel: int = 3, stride: int = 1, groups: int = 1,
                 act: type[nn.Module] | None = nn.ReLU6):
        layers = [nn.Conv2d(cin, cout, kernel, stride, (kernel - 1) // 2, groups=groups,
                            bias=False), nn.BatchNorm2d(cout)]
        if act is not None:
            layers.append(act(inplace=True))
        super().__init__(*layers)


class InvertedResidual(nn.Module):
    """MobileNetV2 block: 1x1 expand (ReLU6), 3x3 depthwise (ReLU6), 1x1 linear projection;
    a shortcut when stride is 1 and the width is kept."""

    def __init__(self, cin: int, cout: int, stride: int, expand_ratio: int):
        super().__init__()
        hidden = int(round(cin * expand_ratio))
        self.use_res_connect = stride == 1 and cin == cout
        layers = [] if expand_ratio == 1 else [ConvBNAct(cin, hidden, 1)]
        layers += [ConvBNAct(hidden, hidden, 3, stride, groups=hidden),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.use_res_connect else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision's MobileNetV2 (Sandler et al. 2018) with a width multiplier."""

    SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                (6, 160, 3, 2), (6, 320, 1, 1)]      # expand t, channels c, repeats n, stride s

    def __init__(self, num_classes: int = 10, width_mult: float = 0.35, last_channel: int = 320):
        super().__init__()
        cin = make_divisible(32 * width_mult)
        features: list[nn.Module] = [ConvBNAct(3, cin, stride=2)]
        for t, c, n, s in self.SETTINGS:
            cout = make_divisible(c * width_mult)
            for i in range(n):
                features.append(InvertedResidual(cin, cout, s if i == 0 else 1, t))
                cin = cout
        features.append(ConvBNAct(cin, last_channel, 1))
        self.features = nn.Sequential(*features)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last_channel, num_classes))

    def forward(self, x):                                      # (N, 3, H, W)
        x = self.features(x)                                   # (N, 320, H/32, W/32)
        x = F.adaptive_avg_pool2d(x, (1, 1))
        x = torch.flatten(x, 1)                                # (N, 320)
        return self.classifier(x)                              # (N, classes)


def test_mobilenet_v2(pnnx_export):
    check_model(pnnx_export, seeded(MobileNetV2()), [image(1, 3, 96, 96)], "zoo_mobilenet_v2")


# ================================================================ MobileNetV3-small

class SqueezeExcitation(nn.Module):
    """x * hardsigmoid(fc2(relu(fc1(avgpool(x))))): channel attention (torchvision's)."""

    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Conv2d(channels, squeeze, 1)
        self.fc2 = nn.Conv2d(squeeze, channels, 1)
        self.activation, self.scale_activation = nn.ReLU(), nn.Hardsigmoid()

    def forward(self, x):
        scale = self.scale_activation(self.fc2(self.activation(self.fc1(self.avgpool(x)))))
        return scale * x


class MobileNetV3Block(nn.Module):
    """Inverted residual with an optional SE block and ReLU or hardswish (Howard et al. 2019)."""

    def __init__(self, cin: int, kernel: int, expanded: int, cout: int, use_se: bool,
                 act: type[nn.Module], stride: int):
        super().__init__()
        self.use_res_connect = stride == 1 and cin == cout
        layers: list[nn.Module] = []
        if expanded != cin:
            layers.append(ConvBNAct(cin, expanded, 1, act=act))
        layers.append(ConvBNAct(expanded, expanded, kernel, stride, groups=expanded, act=act))
        if use_se:
            layers.append(SqueezeExcitation(expanded, make_divisible(expanded // 4)))
        layers.append(ConvBNAct(expanded, cout, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        y = self.block(x)
        return y + x if self.use_res_connect else y


class MobileNetV3Small(nn.Module):
    """torchvision's mobilenet_v3_small layout, width-reduced."""

    RE, HS = nn.ReLU, nn.Hardswish
    SETTINGS = [(3, 16, 16, True, RE, 2), (3, 72, 24, False, RE, 2), (3, 88, 24, False, RE, 1),
                (5, 96, 40, True, HS, 2), (5, 240, 40, True, HS, 1), (5, 240, 40, True, HS, 1),
                (5, 120, 48, True, HS, 1), (5, 144, 48, True, HS, 1), (5, 288, 96, True, HS, 2),
                (5, 576, 96, True, HS, 1), (5, 576, 96, True, HS, 1)]

    def __init__(self, num_classes: int = 10, width_mult: float = 0.5, last_channel: int = 256):
        super().__init__()
        cin = make_divisible(16 * width_mult)
        layers: list[nn.Module] = [ConvBNAct(3, cin, 3, 2, act=nn.Hardswish)]
        for kernel, expanded, cout, use_se, act, stride in self.SETTINGS:
            expanded, cout = make_divisible(expanded * width_mult), make_divisible(cout *
                                                                                   width_mult)
            layers.append(MobileNetV3Block(cin, kernel, expanded, cout, use_se, act, stride))
            cin = cout
        layers.append(ConvBNAct(cin, 6 * cin, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Linear(6 * cin, last_channel), nn.Hardswish(),
                                        nn.Dropout(0.2), nn.Linear(last_channel, num_classes))

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(torch.flatten(x, 1))


def test_mobilenet_v3_small(pnnx_export):
    check_model(pnnx_export, seeded(MobileNetV3Small()), [image(1, 3, 96, 96)],
                "zoo_mobilenet_v3_small")


# ================================================================ YOLOv5s-style detector

class Conv(nn.Module):
    """YOLOv5's Conv: Conv2d (no bias) + BatchNorm2d + SiLU."""

    def __init__(self, cin: int, cout: int, k: int = 1, s: int = 1, p: int | None = None):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, k, s, k // 2 if p is None else p, bias=False)
        self.bn = nn.BatchNorm2d(cout)
        self.act = nn.SiLU()

    def forward(self, x):
        return self.act(self.bn(self.conv(x)))


class Bottleneck(nn.Module):
    def __init__(self, cin: int, cout: int, shortcut: bool = True):
        super().__init__()
        self.cv1, self.cv2 = Conv(cin, cout, 1), Conv(cout, cout, 3)
        self.add = shortcut and cin == cout

    def forward(self, x):
        return x + self.cv2(self.cv1(x)) if self.add else self.cv2(self.cv1(x))


class C3(nn.Module):
    """CSP bottleneck with 3 convolutions: cv3(cat(m(cv1(x)), cv2(x)))."""

    def __init__(self, cin: int, cout: int, n: int = 1, shortcut: bool = True):
        super().__init__()
        hidden = cout // 2
        self.cv1, self.cv2 = Conv(cin, hidden, 1), Conv(cin, hidden, 1)
        self.cv3 = Conv(2 * hidden, cout, 1)
        self.m = nn.Sequential(*(Bottleneck(hidden, hidden, shortcut) for _ in range(n)))

    def forward(self, x):
        return self.cv3(torch.cat((self.m(self.cv1(x)), self.cv2(x)), 1))


class SPPF(nn.Module):
    """Spatial pyramid pooling, fast: three chained 5x5 max pools, concatenated."""

    def __init__(self, cin: int, cout: int, k: int = 5):
        super().__init__()
        hidden = cin // 2
        self.cv1, self.cv2 = Conv(cin, hidden, 1), Conv(hidden * 4, cout, 1)
        self.m = nn.MaxPool2d(k, 1, k // 2)

    def forward(self, x):
        x = self.cv1(x)
        y1 = self.m(x)
        y2 = self.m(y1)
        return self.cv2(torch.cat((x, y1, y2, self.m(y2)), 1))


class Detect(nn.Module):
    """YOLOv5's Detect head in inference mode: per level a 1x1 conv to na * (5 + nc)
    channels, reshaped to (bs, na, ny, nx, no), sigmoid, then boxes decoded on the cell grid:
    xy = (2 sigmoid - 0.5 + grid) * stride, wh = (2 sigmoid)^2 * anchor."""

    def __init__(self, nc: int, anchors, channels, strides):
        super().__init__()
        self.nc, self.no = nc, nc + 5
        self.nl, self.na = len(anchors), len(anchors[0]) // 2
        self.register_buffer("anchors", torch.tensor(anchors, dtype=torch.float32)
                             .view(self.nl, -1, 2))
        self.stride = strides
        self.m = nn.ModuleList(nn.Conv2d(c, self.no * self.na, 1) for c in channels)

    def _make_grid(self, nx: int, ny: int, i: int):
        shape = 1, self.na, ny, nx, 2
        y, x = torch.arange(ny, dtype=torch.float32), torch.arange(nx, dtype=torch.float32)
        yv, xv = torch.meshgrid(y, x, indexing="ij")
        grid = torch.stack((xv, yv), 2).expand(shape) - 0.5      # grid offset: y = 2.0 * x - 0.5
        anchor_grid = (self.anchors[i] * self.stride[i]).view((1, self.na, 1, 1, 2)).expand(shape)
        return grid, anchor_grid

    def forward(self, xs):
        z = []
        for i in range(self.nl):
            x = self.m[i](xs[i])
            bs, _, ny, nx = x.shape
            x = x.view(bs, self.na, self.no, ny, nx).permute(0, 1, 3, 4, 2).contiguous()
            grid, anchor_grid = self._make_grid(nx, ny, i)
            xy, wh, conf = x.sigmoid().split((2, 2, self.nc + 1), 4)
            xy = (xy * 2 + grid) * self.stride[i]
            wh = (wh * 2) ** 2 * anchor_grid
            y = torch.cat((xy, wh, conf), 4)
            z.append(y.view(bs, self.na * nx * ny, self.no))
        return torch.cat(z, 1)                                   # (bs, boxes, 5 + nc)


class YOLOv5(nn.Module):
    """yolov5s.yaml (v6.0+: 6x6 stem, SPPF) with width and depth multipliers."""

    ANCHORS = [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119],
               [116, 90, 156, 198, 373, 326]]

    def __init__(self, nc: int = 3, width: float = 0.125, depth: float = 0.33):
        super().__init__()

        def w(c):
            return make_divisible(c * width)

        def d(n):
            return max(round(n * depth), 1)

        self.b0 = Conv(3, w(64), 6, 2, 2)                        # P1/2
        self.b1, self.b2 = Conv(w(64), w(128), 3, 2), C3(w(128), w(128), d(3))   # P2/4
        self.b3, self.b4 = Conv(w(128), w(256), 3, 2), C3(w(256), w(256), d(6))  # P3/8
        self.b5, self.b6 = Conv(w(256), w(512), 3, 2), C3(w(512), w(512), d(9))  # P4/16
        self.b7, self.b8 = Conv(w(512), w(1024), 3, 2), C3(w(1024), w(1024), d(3))  # P5/32
        self.b9 = SPPF(w(1024), w(1024))
        self.h10, self.h13 = Conv(w(1024), w(512)), C3(w(1024), w(512), d(3), False)
        self.h14, self.h17 = Conv(w(512), w(256)), C3(w(512), w(256), d(3), False)  # P3 out
        self.h18, self.h20 = Conv(w(256), w(256), 3, 2), C3(w(512), w(512), d(3), False)
        self.h21, self.h23 = Conv(w(512), w(512), 3, 2), C3(w(1024), w(1024), d(3), False)
        self.up = nn.Upsample(scale_factor=2, mode="nearest")
        self.detect = Detect(nc, self.ANCHORS, (w(256), w(512), w(1024)), (8.0, 16.0, 32.0))

    def forward(self, x):
        p3 = self.b4(self.b3(self.b2(self.b1(self.b0(x)))))
        p4 = self.b6(self.b5(p3))
        x10 = self.h10(self.b9(self.b8(self.b7(p4))))
        x14 = self.h14(self.h13(torch.cat((self.up(x10), p4), 1)))
        out3 = self.h17(torch.cat((self.up(x14), p3), 1))
        out4 = self.h20(torch.cat((self.h18(out3), x14), 1))
        out5 = self.h23(torch.cat((self.h21(out4), x10), 1))
        return self.detect([out3, out4, out5])


def test_yolov5s_style_detector(pnnx_export):
    graph = check_model(pnnx_export, seeded(YOLOv5()), [image(1, 3, 128, 128)], "zoo_yolov5")
    plan = graph.memory_plan((1, 3, 128, 128))     # the C3 blocks' and the neck's cats
    assert sum(row.how == "joined" for row in plan.operands) >= 8
    assert_plan_sound(plan)


def test_yolov5s_style_detector_exported_dynamic_runs_at_other_sizes(pnnx_export):
    """A dynamic export cannot fold Detect's grids: pnnx writes torch.arange over the feature
    map's size, and torch.meshgrid on lists (aten::meshgrid, prim::ListUnpack)."""
    model = seeded(YOLOv5())
    param, binary = pnnx_export(model, (image(1, 3, 64, 64),), "zoo_yolov5_dynamic",
                                dynamic=True)
    graph = RuntimeGraph(param, binary).build()
    for x in (image(1, 3, 64, 64), image(2, 3, 96, 128, seed=2)):
        with torch.no_grad():
            want = model(x)
        (got,) = graph.forward(x.numpy())
        assert_close(got, want.numpy(), f"dynamic YOLOv5 at {tuple(x.shape)}")


# ================================================================ UNet

class DoubleConv(nn.Sequential):
    """(3x3 conv, BatchNorm, ReLU) twice (Ronneberger et al. 2015, padded as milesial's)."""

    def __init__(self, cin: int, cout: int, mid: int | None = None):
        mid = mid or cout
        super().__init__(nn.Conv2d(cin, mid, 3, padding=1, bias=False), nn.BatchNorm2d(mid),
                         nn.ReLU(inplace=True), nn.Conv2d(mid, cout, 3, padding=1, bias=False),
                         nn.BatchNorm2d(cout), nn.ReLU(inplace=True))


class Down(nn.Sequential):
    def __init__(self, cin: int, cout: int):
        super().__init__(nn.MaxPool2d(2), DoubleConv(cin, cout))


class Up(nn.Module):
    """Upsample (a 2x2 stride-2 transposed conv, or bilinear with align_corners=True), pad to
    the skip's size, concatenate with the skip, DoubleConv."""

    def __init__(self, cin: int, cout: int, bilinear: bool):
        super().__init__()
        if bilinear:
            self.up = nn.Upsample(scale_factor=2, mode="bilinear", align_corners=True)
            self.conv = DoubleConv(cin, cout, cin // 2)
        else:
            self.up = nn.ConvTranspose2d(cin, cin // 2, 2, stride=2)
            self.conv = DoubleConv(cin, cout)

    def forward(self, x, skip):
        x = self.up(x)
        dy, dx = skip.size(2) - x.size(2), skip.size(3) - x.size(3)
        x = F.pad(x, [dx // 2, dx - dx // 2, dy // 2, dy - dy // 2])
        return self.conv(torch.cat([skip, x], dim=1))


class UNet(nn.Module):
    """milesial/Pytorch-UNet's layout; the two deep up-steps use transposed convolutions, the
    two shallow ones bilinear upsampling (one model covers both of its modes)."""

    def __init__(self, n_channels: int = 3, n_classes: int = 2, base: int = 8):
        super().__init__()
        b = base
        self.inc = DoubleConv(n_channels, b)
        self.down1, self.down2 = Down(b, 2 * b), Down(2 * b, 4 * b)
        self.down3, self.down4 = Down(4 * b, 8 * b), Down(8 * b, 16 * b)
        self.up1, self.up2 = Up(16 * b, 8 * b, False), Up(8 * b, 4 * b, False)
        self.up3 = Up(4 * b + 2 * b, 2 * b, True)   # bilinear keeps channels: 4b up + 2b skip
        self.up4 = Up(2 * b + b, b, True)
        self.outc = nn.Conv2d(b, n_classes, 1)

    def forward(self, x):
        x1 = self.inc(x)
        x2 = self.down1(x1)
        x3 = self.down2(x2)
        x4 = self.down3(x3)
        x = self.up2(self.up1(self.down4(x4), x4), x3)
        return self.outc(self.up4(self.up3(x, x2), x1))


def test_unet(pnnx_export):
    graph = check_model(pnnx_export, seeded(UNet()), [image(1, 3, 64, 64)], "zoo_unet")
    plan = graph.memory_plan((1, 3, 64, 64))       # the skips, written into the cats' outputs
    assert sum(row.how == "joined" for row in plan.operands) == 4
    assert_plan_sound(plan)


# ================================================================ ViT

class MLPBlock(nn.Sequential):
    def __init__(self, dim: int, hidden: int):
        super().__init__(nn.Linear(dim, hidden), nn.GELU(), nn.Dropout(0.0),
                         nn.Linear(hidden, dim), nn.Dropout(0.0))


class EncoderBlock(nn.Module):
    """torchvision's ViT encoder block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim, eps=1e-6)
        self.self_attention = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.ln_2 = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = MLPBlock(dim, hidden)

    def forward(self, x):                                        # (N, tokens, dim)
        y = self.ln_1(x)
        y, _ = self.self_attention(y, y, y, need_weights=False)
        x = x + y
        return x + self.mlp(self.ln_2(x))


class TimmAttention(nn.Module):
    """timm's Attention: one qkv Linear, heads split by reshape/permute, fused SDPA."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.qkv, self.proj = nn.Linear(dim, dim * 3), nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)                                  # (B, heads, N, head_dim)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(B, N, C))


class TimmBlock(nn.Module):
    """timm's ViT Block: x + attn(norm1(x)), x + mlp(norm2(x))."""

    def __init__(self, dim: int, heads: int, hidden: int):
        super().__init__()
        self.norm1, self.attn = nn.LayerNorm(dim, eps=1e-6), TimmAttention(dim, heads)
        self.norm2, self.mlp = nn.LayerNorm(dim, eps=1e-6), MLPBlock(dim, hidden)

    def forward(self, x):
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """ViT (Dosovitskiy et al. 2020) as torchvision writes it: patch conv, class token,
    learnt position embedding, encoder blocks, final LayerNorm, head on the class token.
    ``block="torchvision"`` uses nn.MultiheadAttention blocks, ``"timm"`` timm's blocks with
    F.scaled_dot_product_attention."""

    def __init__(self, image: int = 64, patch: int = 8, dim: int = 32, heads: int = 4,
                 depth: int = 2, num_classes: int = 10, block: str = "torchvision"):
        super().__init__()
        self.patch, self.dim = patch, dim
        self.conv_proj = nn.Conv2d(3, dim, patch, patch)
        self.class_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embedding = nn.Parameter(torch.empty(1, (image // patch) ** 2 + 1, dim)
                                          .normal_(std=0.02))
        block_class = EncoderBlock if block == "torchvision" else TimmBlock
        self.layers = nn.Sequential(*(block_class(dim, heads, 4 * dim) for _ in range(depth)))
        self.ln = nn.LayerNorm(dim, eps=1e-6)
        self.head = nn.Linear(dim, num_classes)

    def forward(self, x):                                        # (N, 3, H, W)
        n = x.shape[0]
        x = self.conv_proj(x)                                    # (N, dim, H/p, W/p)
        x = x.reshape(n, self.dim, -1).permute(0, 2, 1)          # (N, tokens, dim)
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
        x = self.layers(x + self.pos_embedding)
        return self.head(self.ln(x)[:, 0])                       # (N, classes)


@pytest.mark.parametrize("block", ["torchvision", "timm"])
def test_vit_two_blocks(pnnx_export, block):
    check_model(pnnx_export, seeded(VisionTransformer(block=block)), [image(2, 3, 64, 64)],
                f"zoo_vit_{block}")


# ================================================================ two inputs, three outputs

class RGBDNet(nn.Module):
    """An RGB image and a depth map, two stems fused by concatenation; three heads: class
    logits, a segmentation mask at input size, an L2-normalised embedding."""

    def __init__(self, classes: int = 5, dim: int = 16):
        super().__init__()
        self.rgb = nn.Sequential(ConvBNAct(3, 16, 3, 2, act=nn.ReLU), ConvBNAct(16, 16, 3))
        self.depth = nn.Sequential(ConvBNAct(1, 8, 3, 2, act=nn.ReLU))
        self.trunk = nn.Sequential(ConvBNAct(24, 32, 3, 2, act=nn.SiLU),
                                   InvertedResidual(32, 32, 1, 4))
        self.classifier = nn.Linear(32, classes)
        self.segment = nn.Conv2d(32, 2, 1)
        self.embed = nn.Linear(32, dim)

    def forward(self, rgb, depth):
        x = torch.cat([self.rgb(rgb), self.depth(depth)], 1)     # (N, 24, H/2, W/2)
        x = self.trunk(x)                                        # (N, 32, H/4, W/4)
        pooled = x.mean((2, 3))                                  # (N, 32)
        mask = F.interpolate(self.segment(x), size=rgb.shape[2:], mode="bilinear",
                             align_corners=False)                # (N, 2, H, W)
        return self.classifier(pooled), mask, F.normalize(self.embed(pooled), dim=1)


def test_two_inputs_three_outputs(pnnx_export):
    check_model(pnnx_export, seeded(RGBDNet()), [image(2, 3, 64, 48), image(2, 1, 64, 48, seed=2)],
                "zoo_rgbd")
