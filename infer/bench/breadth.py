"""The benchmark's breadth models: one of each family a CPU runtime meets, with seeded random
weights (the benchmark times operators and compares outputs; trained weights add nothing).

    mobilenet_v2        torchvision's MobileNetV2, 224x224
    mobilenet_v3_small  torchvision's MobileNetV3-small, 224x224
    vit_small           torchvision's VisionTransformer at ViT-S/16-ish size, 224x224
    yolo_320            a YOLOv8-n-sized detector, 320x320
    unet_256            a 4-level UNet, 256x256, one class
    text_recognizer     conv stem + transformer encoder + CTC head, 48x320

The torchvision architectures are written out here, with torchvision's module names, not
imported: torchvision is no dependency. Each ``make_*`` returns
the torch module in eval mode; torch is imported when one is called.
"""

from __future__ import annotations

from infer import export


def seeded(model, seed: int = 0):
    """``model`` with every layer mattering: BatchNorm statistics and affines random
    (``export.randomize``), LayerNorm affines random, and each parameter torch initializes to
    zeros (biases, ViT's head and class token) filled from N(0, 0.02^2)."""
    import torch

    export.randomize(model, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.LayerNorm) and module.elementwise_affine:
                module.weight.uniform_(0.5, 1.5, generator=generator)
                if module.bias is not None:
                    module.bias.uniform_(-0.2, 0.2, generator=generator)
        for parameter in model.parameters():
            if not parameter.any():
                parameter.normal_(0.0, 0.02, generator=generator)
    return model.eval()


def _divisible(value: float, divisor: int = 8) -> int:
    """torchvision's _make_divisible: channels rounded to a multiple of 8, losing <= 10 %."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _conv_bn(c1, c2, k=3, s=1, groups=1, act=None, eps=1e-5):
    """torchvision's Conv2dNormActivation: Conv2d (no bias), BatchNorm2d, activation."""
    from torch import nn

    layers = [nn.Conv2d(c1, c2, k, s, (k - 1) // 2, groups=groups, bias=False),
              nn.BatchNorm2d(c2, eps=eps)]
    return nn.Sequential(*layers, *([act()] if act else []))


# ------------------------------------------------------------------------------ MobileNets
def make_mobilenet_v2(classes: int = 1000):
    """torchvision's mobilenet_v2 (Sandler et al. 2018), width 1.0, with its module names:
    inverted residuals (1x1 expand, 3x3 depthwise, ReLU6, 1x1 linear projection, a shortcut
    where the shape is kept), a 1x1 to 1280, global average pool, dropout, linear."""
    import torch
    from torch import nn

    class InvertedResidual(nn.Module):
        def __init__(self, c1, c2, stride, expand):
            super().__init__()
            hidden = c1 * expand
            self.use_res_connect = stride == 1 and c1 == c2
            layers = [] if expand == 1 else [_conv_bn(c1, hidden, 1, act=nn.ReLU6)]
            self.conv = nn.Sequential(*layers,
                                      _conv_bn(hidden, hidden, 3, stride, hidden, nn.ReLU6),
                                      nn.Conv2d(hidden, c2, 1, bias=False), nn.BatchNorm2d(c2))

        def forward(self, x):
            return x + self.conv(x) if self.use_res_connect else self.conv(x)

    class MobileNetV2(nn.Module):
        SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
                    (6, 160, 3, 2), (6, 320, 1, 1)]     # expand t, channels c, repeats n, stride

        def __init__(self):
            super().__init__()
            features, c1 = [_conv_bn(3, 32, 3, 2, act=nn.ReLU6)], 32
            for t, c, n, s in self.SETTINGS:
                for i in range(n):
                    features.append(InvertedResidual(c1, c, s if i == 0 else 1, t))
                    c1 = c
            features.append(_conv_bn(c1, 1280, 1, act=nn.ReLU6))
            self.features = nn.Sequential(*features)
            self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))

        def forward(self, x):                                          # (N, 3, H, W)
            x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
            return self.classifier(torch.flatten(x, 1))                # (N, classes)

    torch.manual_seed(0)
    return seeded(MobileNetV2())


def make_mobilenet_v3_small(classes: int = 1000):
    """torchvision's mobilenet_v3_small (Howard et al. 2019), width 1.0, with its module
    names: inverted residuals with ReLU or hardswish and squeeze-excitation (average pool,
    1x1, ReLU, 1x1, hardsigmoid, scale), BatchNorm eps 1e-3, a 1x1 to 576, global average
    pool, linear 1024, hardswish, dropout, linear."""
    import torch
    from torch import nn

    class SqueezeExcitation(nn.Module):
        def __init__(self, channels, squeeze):
            super().__init__()
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc1, self.fc2 = nn.Conv2d(channels, squeeze, 1), nn.Conv2d(squeeze, channels, 1)
            self.activation, self.scale_activation = nn.ReLU(), nn.Hardsigmoid()

        def forward(self, x):
            scale = self.fc2(self.activation(self.fc1(self.avgpool(x))))
            return self.scale_activation(scale) * x

    class InvertedResidual(nn.Module):
        def __init__(self, c1, k, expanded, c2, se, act, stride):
            super().__init__()
            self.use_res_connect = stride == 1 and c1 == c2
            layers = [] if expanded == c1 else [_conv_bn(c1, expanded, 1, act=act, eps=1e-3)]
            layers.append(_conv_bn(expanded, expanded, k, stride, expanded, act, eps=1e-3))
            if se:
                layers.append(SqueezeExcitation(expanded, _divisible(expanded // 4)))
            layers.append(_conv_bn(expanded, c2, 1, eps=1e-3))
            self.block = nn.Sequential(*layers)

        def forward(self, x):
            return x + self.block(x) if self.use_res_connect else self.block(x)

    RE, HS = nn.ReLU, nn.Hardswish
    settings = [(16, 3, 16, 16, True, RE, 2), (16, 3, 72, 24, False, RE, 2),
                (24, 3, 88, 24, False, RE, 1), (24, 5, 96, 40, True, HS, 2),
                (40, 5, 240, 40, True, HS, 1), (40, 5, 240, 40, True, HS, 1),
                (40, 5, 120, 48, True, HS, 1), (48, 5, 144, 48, True, HS, 1),
                (48, 5, 288, 96, True, HS, 2), (96, 5, 576, 96, True, HS, 1),
                (96, 5, 576, 96, True, HS, 1)]   # in, kernel, expanded, out, SE, act, stride

    class MobileNetV3(nn.Module):
        def __init__(self):
            super().__init__()
            self.features = nn.Sequential(_conv_bn(3, 16, 3, 2, act=HS, eps=1e-3),
                                          *(InvertedResidual(*s) for s in settings),
                                          _conv_bn(96, 576, 1, act=HS, eps=1e-3))
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.classifier = nn.Sequential(nn.Linear(576, 1024), nn.Hardswish(),
                                            nn.Dropout(0.2), nn.Linear(1024, classes))

        def forward(self, x):                                          # (N, 3, H, W)
            x = torch.flatten(self.avgpool(self.features(x)), 1)       # (N, 576)
            return self.classifier(x)                                  # (N, classes)

    torch.manual_seed(0)
    return seeded(MobileNetV3())


# ------------------------------------------------------------------------------------- ViT
def make_vit_small(image_size: int = 224, patch_size: int = 16, num_layers: int = 6,
                   num_heads: int = 6, hidden_dim: int = 384, mlp_dim: int = 1536,
                   num_classes: int = 1000):
    """torchvision's VisionTransformer (Dosovitskiy et al. 2020) with its module names, at
    ViT-S/16-ish size by default (ViT-S's width 384, 6 heads and MLP 1536, half its 12
    layers; 197 tokens at 224x224): a patch convolution, a class token, a learned position
    embedding, pre-norm encoder blocks (LayerNorm eps 1e-6, nn.MultiheadAttention, GELU
    MLP), LayerNorm, a linear head on the class token."""
    from collections import OrderedDict

    import torch
    from torch import nn

    class EncoderBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(hidden_dim, eps=1e-6)
            self.self_attention = nn.MultiheadAttention(hidden_dim, num_heads, batch_first=True)
            self.ln_2 = nn.LayerNorm(hidden_dim, eps=1e-6)
            self.mlp = nn.Sequential(nn.Linear(hidden_dim, mlp_dim), nn.GELU(), nn.Dropout(0.0),
                                     nn.Linear(mlp_dim, hidden_dim), nn.Dropout(0.0))

        def forward(self, x):                                          # (N, tokens, dim)
            y = self.ln_1(x)
            x = x + self.self_attention(y, y, y, need_weights=False)[0]
            return x + self.mlp(self.ln_2(x))

    class Encoder(nn.Module):
        def __init__(self, tokens):
            super().__init__()
            self.pos_embedding = nn.Parameter(torch.empty(1, tokens, hidden_dim).normal_(
                std=0.02))
            self.layers = nn.Sequential(OrderedDict((f"encoder_layer_{i}", EncoderBlock())
                                                    for i in range(num_layers)))
            self.ln = nn.LayerNorm(hidden_dim, eps=1e-6)

        def forward(self, x):
            return self.ln(self.layers(x + self.pos_embedding))

    class VisionTransformer(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv_proj = nn.Conv2d(3, hidden_dim, patch_size, patch_size)
            self.class_token = nn.Parameter(torch.zeros(1, 1, hidden_dim))
            self.encoder = Encoder((image_size // patch_size) ** 2 + 1)
            self.heads = nn.Sequential()
            self.heads.add_module("head", nn.Linear(hidden_dim, num_classes))

        def forward(self, x):                                          # (N, 3, H, W)
            n = x.shape[0]
            x = self.conv_proj(x).reshape(n, hidden_dim, -1).permute(0, 2, 1)  # (N, HW/p^2, D)
            x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1)
            return self.heads(self.encoder(x)[:, 0])                   # (N, classes)

    torch.manual_seed(0)
    return seeded(VisionTransformer())


# ------------------------------------------------------------------------------------ YOLO
def make_yolo():
    """A YOLOv8-n-sized detector (width 0.25, depth 0.33 of YOLOv8's, 80 classes): a C2f
    backbone with SiLU, SPPF, a PAN neck (nearest upsample, concat) and three decoupled heads.
    Output (N, 4 + 80, A), A = anchors over strides 8, 16, 32 (2100 at 320x320): the four box
    distances of the DFL (softmax over 16 bins, expectation) and the class sigmoids; boxes are
    left as distances (no anchor grid), so the module runs at any input size."""
    import torch
    from torch import nn

    def conv(c1, c2, k=1, s=1):                        # Conv2d + BN + SiLU, "same" padding
        return nn.Sequential(nn.Conv2d(c1, c2, k, s, k // 2, bias=False),
                             nn.BatchNorm2d(c2), nn.SiLU())

    class Bottleneck(nn.Module):
        def __init__(self, c, shortcut):
            super().__init__()
            self.cv1, self.cv2, self.add = conv(c, c, 3), conv(c, c, 3), shortcut

        def forward(self, x):
            y = self.cv2(self.cv1(x))
            return x + y if self.add else y

    class C2f(nn.Module):
        """Split a 1x1 conv's output in two halves, run n bottlenecks on the second, concat
        every intermediate, 1x1 conv."""

        def __init__(self, c1, c2, n, shortcut):
            super().__init__()
            self.c = c2 // 2
            self.cv1 = conv(c1, 2 * self.c)
            self.cv2 = conv((2 + n) * self.c, c2)
            self.m = nn.ModuleList(Bottleneck(self.c, shortcut) for _ in range(n))

        def forward(self, x):
            y = list(self.cv1(x).chunk(2, 1))
            y.extend(m(y[-1]) for m in self.m)
            return self.cv2(torch.cat(y, 1))

    class SPPF(nn.Module):
        """Three 5x5 max pools in a row, concatenated with their input."""

        def __init__(self, c1, c2):
            super().__init__()
            self.cv1, self.cv2 = conv(c1, c1 // 2), conv(2 * c1, c2)
            self.m = nn.MaxPool2d(5, 1, 2)

        def forward(self, x):
            y = [self.cv1(x)]
            y.extend(self.m(y[-1]) for _ in range(3))
            return self.cv2(torch.cat(y, 1))

    class Detector(nn.Module):
        def __init__(self, classes=80, reg_max=16):
            super().__init__()
            self.classes, self.reg_max = classes, reg_max
            self.stem = nn.Sequential(conv(3, 16, 3, 2), conv(16, 32, 3, 2), C2f(32, 32, 1, True))
            self.p3 = nn.Sequential(conv(32, 64, 3, 2), C2f(64, 64, 2, True))
            self.p4 = nn.Sequential(conv(64, 128, 3, 2), C2f(128, 128, 2, True))
            self.p5 = nn.Sequential(conv(128, 256, 3, 2), C2f(256, 256, 1, True), SPPF(256, 256))
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.top_down4, self.top_down3 = C2f(384, 128, 1, False), C2f(192, 64, 1, False)
            self.down3, self.down4 = conv(64, 64, 3, 2), conv(128, 128, 3, 2)
            self.bottom_up4, self.bottom_up5 = C2f(192, 128, 1, False), C2f(384, 256, 1, False)
            box, cls = 4 * reg_max, classes
            self.box = nn.ModuleList(nn.Sequential(conv(c, 64, 3), conv(64, 64, 3),
                                                   nn.Conv2d(64, box, 1)) for c in (64, 128, 256))
            self.cls = nn.ModuleList(nn.Sequential(conv(c, 80, 3), conv(80, 80, 3),
                                                   nn.Conv2d(80, cls, 1)) for c in (64, 128, 256))
            self.dfl = nn.Conv2d(reg_max, 1, 1, bias=False)   # the expectation over the bins
            self.dfl.weight.data[:] = torch.arange(reg_max, dtype=torch.float32).view(
                1, reg_max, 1, 1)
            self.dfl.requires_grad_(False)

        def forward(self, x):                                  # (N, 3, H, W)
            p3 = self.p3(self.stem(x))                         # (N, 64, H/8, W/8)
            p4 = self.p4(p3)                                   # (N, 128, H/16, W/16)
            p5 = self.p5(p4)                                   # (N, 256, H/32, W/32)
            n4 = self.top_down4(torch.cat([self.up(p5), p4], 1))
            n3 = self.top_down3(torch.cat([self.up(n4), p3], 1))        # (N, 64, H/8, W/8)
            n4 = self.bottom_up4(torch.cat([self.down3(n3), n4], 1))    # (N, 128, H/16, W/16)
            n5 = self.bottom_up5(torch.cat([self.down4(n4), p5], 1))    # (N, 256, H/32, W/32)
            levels = [torch.cat([b(f), c(f)], 1).flatten(2)          # (N, 64 + 80, h w)
                      for f, b, c in zip((n3, n4, n5), self.box, self.cls)]
            y = torch.cat(levels, 2)                                    # (N, 144, A)
            box, cls = y.split((4 * self.reg_max, self.classes), 1)
            n, _, a = box.shape
            bins = box.view(n, 4, self.reg_max, a).transpose(2, 1).softmax(1)  # (N, 16, 4, A)
            distances = self.dfl(bins).view(n, 4, a)                    # (N, 4, A)
            return torch.cat([distances, cls.sigmoid()], 1)             # (N, 84, A)

    torch.manual_seed(0)
    return seeded(Detector())


# ------------------------------------------------------------------------------------ UNet
def make_unet(base: int = 16, classes: int = 1):
    """A UNet (Ronneberger et al. 2015) of 4 levels, ``base`` channels doubling per level, a
    bottleneck of 16 ``base``: each stage two 3x3 convolutions with BatchNorm and ReLU,
    2x2 max pool down, 2x2 stride-2 transposed convolution up, skip concat; a 1x1 head to
    ``classes`` logits at the input's size."""
    import torch
    from torch import nn

    def double(c1, c2):
        return nn.Sequential(nn.Conv2d(c1, c2, 3, 1, 1, bias=False), nn.BatchNorm2d(c2),
                             nn.ReLU(inplace=True), nn.Conv2d(c2, c2, 3, 1, 1, bias=False),
                             nn.BatchNorm2d(c2), nn.ReLU(inplace=True))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            widths = [base * 2 ** i for i in range(4)]                 # 16 32 64 128
            self.down = nn.ModuleList(double(c1, c2) for c1, c2 in zip([3] + widths, widths))
            self.pool = nn.MaxPool2d(2)
            self.bottom = double(widths[-1], 2 * widths[-1])
            self.up = nn.ModuleList(nn.ConvTranspose2d(2 * c, c, 2, 2) for c in widths[::-1])
            self.decode = nn.ModuleList(double(2 * c, c) for c in widths[::-1])
            self.head = nn.Conv2d(widths[0], classes, 1)

        def forward(self, x):                                          # (N, 3, H, W)
            skips = []
            for stage in self.down:
                x = stage(x)
                skips.append(x)
                x = self.pool(x)
            x = self.bottom(x)                                         # (N, 256, H/16, W/16)
            for up, decode, skip in zip(self.up, self.decode, skips[::-1]):
                x = decode(torch.cat([up(x), skip], 1))
            return self.head(x)                                        # (N, classes, H, W)

    torch.manual_seed(0)
    return seeded(UNet())


# ------------------------------------------------------------------------ text recognizer
def make_text_recognizer(dim: int = 192, heads: int = 6, blocks: int = 3, classes: int = 97):
    """A CTC text-line recognizer, SVTR-style, for 48x320 crops: a conv stem (3x3 convolutions
    with BatchNorm and ReLU, strides 2, 2, (2, 1), (2, 1), then a (3, 1) convolution) takes
    (N, 3, 48, 320) to a sequence (N, dim, 1, 80); a learned position embedding, ``blocks``
    pre-norm transformer encoder layers (``heads`` heads, GELU MLP of 4 dim), LayerNorm; a
    linear CTC head over ``classes`` (blank included) and log_softmax: (N, 80, classes)."""
    import torch
    from torch import nn

    def conv(c1, c2, stride):
        return nn.Sequential(nn.Conv2d(c1, c2, 3, stride, 1, bias=False), nn.BatchNorm2d(c2),
                             nn.ReLU(inplace=True))

    class Recognizer(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Sequential(conv(3, 32, 2), conv(32, 64, 2), conv(64, 128, (2, 1)),
                                      conv(128, dim, (2, 1)), nn.Conv2d(dim, dim, (3, 1)))
            self.position = nn.Parameter(torch.zeros(1, 80, dim))
            layer = nn.TransformerEncoderLayer(dim, heads, 4 * dim, dropout=0.0,
                                               activation="gelu", batch_first=True,
                                               norm_first=True)
            self.encoder = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(dim)
            self.head = nn.Linear(dim, classes)

        def forward(self, x):                                        # (N, 3, 48, 320)
            x = self.stem(x).squeeze(2).transpose(1, 2)              # (N, 80, dim)
            x = self.norm(self.encoder(x + self.position))
            return self.head(x).log_softmax(-1)                      # (N, 80, classes)

    torch.manual_seed(0)
    model = Recognizer()
    with torch.no_grad():
        model.position.normal_(0.0, 0.02)
    return seeded(model)
