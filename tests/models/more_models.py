"""Small but faithful instances of architectures people bring (not the shipped ones), for
test_models_more.py beside it: seeded random weights, narrow layers, small inputs.

    MODELS[name] = (model class, input shapes)
"""
# torch models written densely, one module a few lines, as in the papers' reference code

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Bottleneck(nn.Module):
    def __init__(self, cin, mid, stride=1):
        super().__init__()
        self.c1 = nn.Conv2d(cin, mid, 1, bias=False)
        self.b1 = nn.BatchNorm2d(mid)
        self.c2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False)
        self.b2 = nn.BatchNorm2d(mid)
        self.c3 = nn.Conv2d(mid, mid*4, 1, bias=False)
        self.b3 = nn.BatchNorm2d(mid*4)
        self.down = nn.Sequential(nn.Conv2d(cin, mid*4, 1, stride, bias=False), nn.BatchNorm2d(mid*4)) if stride != 1 or cin != mid*4 else None

    def forward(self, x):
        i = x if self.down is None else self.down(x)
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        y = self.b3(self.c3(y))
        return F.relu(y + i)


class ResNet50ish(nn.Module):
    """ResNet-50's bottleneck blocks (1x1, 3x3, 1x1 x4, projection shortcut), narrow."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, 1))
        self.l1 = nn.Sequential(Bottleneck(16, 8), Bottleneck(32, 8))
        self.l2 = nn.Sequential(Bottleneck(32, 16, 2), Bottleneck(64, 16))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.pool(self.l2(self.l1(self.stem(x)))), 1))

class DenseLayer(nn.Module):
    def __init__(self, cin, g):
        super().__init__()
        self.n1 = nn.BatchNorm2d(cin)
        self.c1 = nn.Conv2d(cin, 4*g, 1, bias=False)
        self.n2 = nn.BatchNorm2d(4*g)
        self.c2 = nn.Conv2d(4*g, g, 3, 1, 1, bias=False)

    def forward(self, feats):
        x = torch.cat(feats, 1)
        return self.c2(F.relu(self.n2(self.c1(F.relu(self.n1(x))))))


class DenseNetish(nn.Module):
    """DenseNet: each layer reads the concatenation of all earlier feature maps."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 16, 3, 2, 1)
        self.layers = nn.ModuleList([DenseLayer(16 + i*8, 8) for i in range(3)])
        self.trans = nn.Sequential(nn.BatchNorm2d(40), nn.ReLU(), nn.Conv2d(40, 20, 1), nn.AvgPool2d(2, 2))
        self.fc = nn.Linear(20, 5)

    def forward(self, x):
        feats = [self.stem(x)]
        for l in self.layers:
            feats.append(l(feats))
        y = self.trans(torch.cat(feats, 1))
        y = F.adaptive_avg_pool2d(F.relu(y), (1, 1))
        return self.fc(torch.flatten(y, 1))

def channel_shuffle(x, groups):
    b, c, h, w = x.size()
    x = x.view(b, groups, c // groups, h, w)
    x = torch.transpose(x, 1, 2).contiguous()
    return x.view(b, -1, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, inp, oup, stride):
        super().__init__()
        self.stride = stride
        bf = oup // 2
        if stride > 1:
            self.branch1 = nn.Sequential(nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False), nn.BatchNorm2d(inp),
                                      nn.Conv2d(inp, bf, 1, bias=False), nn.BatchNorm2d(bf), nn.ReLU(inplace=True))
        else:
            self.branch1 = nn.Sequential()
        self.branch2 = nn.Sequential(nn.Conv2d(inp if stride > 1 else bf, bf, 1, bias=False), nn.BatchNorm2d(bf), nn.ReLU(inplace=True),
                                  nn.Conv2d(bf, bf, 3, stride, 1, groups=bf, bias=False), nn.BatchNorm2d(bf),
                                  nn.Conv2d(bf, bf, 1, bias=False), nn.BatchNorm2d(bf), nn.ReLU(inplace=True))

    def forward(self, x):
        if self.stride == 1:
            x1, x2 = x.chunk(2, dim=1)
            out = torch.cat((x1, self.branch2(x2)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2ish(nn.Module):
    """ShuffleNetV2: chunk, depthwise convs, concat and view/transpose channel shuffle."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(3, 12, 3, 2, 1, bias=False), nn.BatchNorm2d(12), nn.ReLU(inplace=True))
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.stage = nn.Sequential(ShuffleUnit(12, 24, 2), ShuffleUnit(24, 24, 1), ShuffleUnit(24, 48, 2), ShuffleUnit(48, 48, 1))
        self.fc = nn.Linear(48, 7)

    def forward(self, x):
        x = self.stage(self.maxpool(self.conv1(x)))
        return self.fc(x.mean([2, 3]))

class Fire(nn.Module):
    def __init__(self, cin, sq, e1, e3):
        super().__init__()
        self.squeeze = nn.Conv2d(cin, sq, 1)
        self.e1 = nn.Conv2d(sq, e1, 1)
        self.e3 = nn.Conv2d(sq, e3, 3, padding=1)

    def forward(self, x):
        x = F.relu(self.squeeze(x), inplace=True)
        return torch.cat([F.relu(self.e1(x)), F.relu(self.e3(x))], 1)


class SqueezeNetish(nn.Module):
    """SqueezeNet: fire modules (squeeze 1x1, expand 1x1 and 3x3, concat), ceil-mode pools."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(nn.Conv2d(3, 16, 3, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, ceil_mode=True),
                                   Fire(16, 4, 8, 8), Fire(16, 4, 8, 8), nn.MaxPool2d(3, 2, ceil_mode=True), Fire(16, 8, 16, 16))
        self.classifier = nn.Sequential(nn.Dropout(0.5), nn.Conv2d(32, 10, 1), nn.ReLU(inplace=True), nn.AdaptiveAvgPool2d((1, 1)))

    def forward(self, x):
        return torch.flatten(self.classifier(self.features(x)), 1)

class BasicConv(nn.Module):
    def __init__(self, cin, cout, **kw):
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, bias=False, **kw)
        self.bn = nn.BatchNorm2d(cout, eps=0.001)

    def forward(self, x): return F.relu(self.bn(self.conv(x)), inplace=True)


class Inception(nn.Module):
    def __init__(self, cin):
        super().__init__()
        self.b1 = BasicConv(cin, 8, kernel_size=1)
        self.b2 = nn.Sequential(BasicConv(cin, 6, kernel_size=1), BasicConv(6, 8, kernel_size=3, padding=1))
        self.b3 = nn.Sequential(BasicConv(cin, 4, kernel_size=1), BasicConv(4, 6, kernel_size=(1, 5), padding=(0, 2)), BasicConv(6, 6, kernel_size=(5, 1), padding=(2, 0)))
        self.b4 = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), BasicConv(cin, 4, kernel_size=1))

    def forward(self, x):
        return torch.cat([self.b1(x), self.b2(x), self.b3(x), F.avg_pool2d(self.b4(x), 3, 1, 1, count_include_pad=False)], 1)


class GoogLeNetish(nn.Module):
    """GoogLeNet / Inception: four parallel branches (1x1, 3x3, 1x5+5x1, pool) concatenated."""

    def __init__(self):
        super().__init__()
        self.stem = BasicConv(3, 12, kernel_size=3, stride=2, padding=1)
        self.i1 = Inception(12)
        self.i2 = Inception(26)
        self.fc = nn.Linear(26, 4)

    def forward(self, x):
        x = self.i2(F.max_pool2d(self.i1(self.stem(x)), 3, 2, ceil_mode=True))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))

class ResNeXtBlock(nn.Module):
    def __init__(self, c, groups, stride):
        super().__init__()
        self.c1 = nn.Conv2d(c, 2*c, 1, bias=False)
        self.b1 = nn.BatchNorm2d(2*c)
        self.c2 = nn.Conv2d(2*c, 2*c, 3, stride, 1, groups=groups, bias=False)
        self.b2 = nn.BatchNorm2d(2*c)
        self.se1 = nn.Conv2d(2*c, c//2, 1)
        self.se2 = nn.Conv2d(c//2, 2*c, 1)
        self.c3 = nn.Conv2d(2*c, c, 1, bias=False)
        self.b3 = nn.BatchNorm2d(c)
        self.short = nn.Sequential(nn.Conv2d(c, c, 1, stride, bias=False), nn.BatchNorm2d(c))

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = F.relu(self.b2(self.c2(y)))
        w = torch.sigmoid(self.se2(F.relu(self.se1(y.mean((2, 3), keepdim=True)))))
        y = self.b3(self.c3(y * w))
        return F.relu(y + self.short(x))


class RegNetish(nn.Module):
    """RegNet / ResNeXt: grouped 3x3 convs with squeeze-excitation from a mean over (H, W)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        self.blocks = nn.Sequential(ResNeXtBlock(16, 4, 2), ResNeXtBlock(16, 8, 1))
        self.head = nn.Linear(16, 3)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((-2, -1)))

class LayerNorm2d(nn.LayerNorm):
    def forward(self, x):
        x = x.permute(0, 2, 3, 1)
        x = F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return x.permute(0, 3, 1, 2)


class CNBlock(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.dw = nn.Conv2d(dim, dim, 7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pw1 = nn.Linear(dim, 4*dim)
        self.pw2 = nn.Linear(4*dim, dim)
        self.gamma = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        y = self.dw(x).permute(0, 2, 3, 1)
        y = self.pw2(F.gelu(self.pw1(self.norm(y))))
        y = self.gamma * y
        return x + y.permute(0, 3, 1, 2)


class ConvNeXtish(nn.Module):
    """ConvNeXt: depthwise 7x7, channels-last LayerNorm + Linear + GELU, layer scale."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 4, 4), LayerNorm2d(16, eps=1e-6))
        self.b1 = CNBlock(16)
        self.down = nn.Sequential(LayerNorm2d(16, eps=1e-6), nn.Conv2d(16, 32, 2, 2))
        self.b2 = CNBlock(32)
        self.norm = nn.LayerNorm(32)
        self.head = nn.Linear(32, 5)

    def forward(self, x):
        x = self.b2(self.down(self.b1(self.stem(x))))
        return self.head(self.norm(x.mean([-2, -1])))

def window_partition(x, ws):
    B, H, W, C = x.shape
    x = x.view(B, H // ws, ws, W // ws, ws, C)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, C)


def window_reverse(w, ws, H, W):
    B = int(w.shape[0] / (H * W / ws / ws))
    x = w.view(B, H // ws, W // ws, ws, ws, -1)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(B, H, W, -1)


class WindowAttention(nn.Module):
    def __init__(self, dim, ws, heads):
        super().__init__()
        self.dim, self.ws, self.heads = dim, ws, heads
        self.scale = (dim // heads) ** -0.5
        self.rpb = nn.Parameter(torch.randn((2*ws-1)**2, heads) * 0.1)
        coords = torch.stack(torch.meshgrid([torch.arange(ws), torch.arange(ws)], indexing="ij")).flatten(1)
        rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
        rel[:, :, 0] += ws - 1
        rel[:, :, 1] += ws - 1
        rel[:, :, 0] *= 2*ws - 1
        self.register_buffer("rpi", rel.sum(-1))
        self.qkv = nn.Linear(dim, dim*3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.heads, C // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.rpb[self.rpi.view(-1)].view(self.ws*self.ws, self.ws*self.ws, -1).permute(2, 0, 1).contiguous()
        attn = attn + bias.unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.heads, N, N)
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B_, N, C)
        return self.proj(x)


class SwinBlock(nn.Module):
    def __init__(self, dim, res, ws, shift):
        super().__init__()
        self.res, self.ws, self.shift = res, ws, shift
        self.n1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, ws, 2)
        self.n2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2*dim), nn.GELU(), nn.Linear(2*dim, dim))
        if shift:
            H = W = res
            img_mask = torch.zeros((1, H, W, 1))
            cnt = 0
            for h in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                for w in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                    img_mask[:, h, w, :] = cnt
                    cnt += 1
            mw = window_partition(img_mask, ws).view(-1, ws*ws)
            am = mw.unsqueeze(1) - mw.unsqueeze(2)
            am = am.masked_fill(am != 0, -100.0).masked_fill(am == 0, 0.0)
        else:
            am = None
        self.register_buffer("attn_mask", am)

    def forward(self, x):
        H = W = self.res
        B, L, C = x.shape
        sc = x
        x = self.n1(x).view(B, H, W, C)
        if self.shift:
            x = torch.roll(x, shifts=(-self.shift, -self.shift), dims=(1, 2))
        xw = window_partition(x, self.ws).view(-1, self.ws*self.ws, C)
        aw = self.attn(xw, self.attn_mask).view(-1, self.ws, self.ws, C)
        x = window_reverse(aw, self.ws, H, W)
        if self.shift:
            x = torch.roll(x, shifts=(self.shift, self.shift), dims=(1, 2))
        x = sc + x.view(B, H*W, C)
        return x + self.mlp(self.n2(x))


class Swinish(nn.Module):
    """Swin: window attention with relative position bias, shifted windows (roll + mask)."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Conv2d(3, 16, 4, 4)
        self.norm = nn.LayerNorm(16)
        self.b1 = SwinBlock(16, 16, 4, 0)
        self.b2 = SwinBlock(16, 16, 4, 2)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = self.norm(self.embed(x).flatten(2).transpose(1, 2))
        x = self.b2(self.b1(x))
        return self.head(x.mean(1))

class MobileViTish(nn.Module):
    """MobileViT: unfold patches with reshape/transpose, a transformer layer, fold back."""

    def __init__(self, ph=2, pw=2):
        super().__init__()
        self.ph, self.pw = ph, pw
        self.local = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.SiLU(), nn.Conv2d(8, 16, 1))
        self.tr = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, activation="gelu")
        self.fuse = nn.Conv2d(16, 8, 1)

    def forward(self, x):
        y = self.local(x)                                # N, C, H, W
        N, C, H, W = y.shape
        nh, nw = H // self.ph, W // self.pw
        y = y.reshape(N * C * nh, self.ph, nw, self.pw).transpose(1, 2)
        y = y.reshape(N, C, nh * nw, self.ph * self.pw).transpose(1, 3).reshape(N * self.ph * self.pw, nh * nw, C)
        y = self.tr(y)
        y = y.contiguous().view(N, self.ph * self.pw, nh * nw, C).transpose(1, 3)
        y = y.reshape(N * C * nh, nw, self.ph, self.pw).transpose(1, 2).reshape(N, C, nh * self.ph, nw * self.pw)
        return self.fuse(y)


class MobileViTv2ish(nn.Module):
    """MobileViT-v2 (timm): patches (N, C, P, patches) by reshape and permute, separable
    linear attention, back by reshape, permute, reshape; pnnx writes that last as a
    PixelShuffle without its first reshape (mended in infer/rewrite.py)."""

    def __init__(self, p=2):
        super().__init__()
        self.p = p
        self.local = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.SiLU(), nn.Conv2d(8, 16, 1))
        self.norm = nn.GroupNorm(1, 16)
        self.qkv = nn.Conv2d(16, 1 + 2 * 16, 1)
        self.out = nn.Conv2d(16, 16, 1)
        self.fuse = nn.Conv2d(16, 8, 1)

    def forward(self, x):
        y = self.local(x)
        N, C, H, W = y.shape
        p, nh, nw = self.p, H // self.p, W // self.p
        patches = y.reshape(N, C, nh, p, nw, p).permute(0, 1, 3, 5, 2, 4).reshape(N, C, p * p, nh * nw)
        q, k, v = self.qkv(self.norm(patches)).split([1, C, C], dim=1)
        context = (k * q.softmax(dim=-1)).sum(dim=-1, keepdim=True)
        patches = patches + self.out(F.relu(v) * context)
        y = patches.reshape(N, C, p, p, nh, nw).permute(0, 1, 4, 2, 5, 3).reshape(N, C, H, W)
        return self.fuse(y)


class SharedPosEnc(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.proj = nn.Conv2d(c, c, 3, 1, 1, groups=c)

    def forward(self, x):
        return self.proj(x) + x


class CoaTBlock(nn.Module):
    def __init__(self, c, shared):
        super().__init__()
        self.cpe = shared                                # the same module in every block
        self.mlp = nn.Sequential(nn.Conv2d(c, 2 * c, 1), nn.GELU(), nn.Conv2d(2 * c, c, 1))

    def forward(self, x):
        x = self.cpe(x)
        return x + self.mlp(x)


class CoaTish(nn.Module):
    """CoaT (timm): one convolutional position encoding shared by the blocks of a stage; pnnx
    writes its second use as a conv reading its weights as inputs (infer/rewrite.py)."""

    def __init__(self, c=16):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 4, 4)
        self.cpe = SharedPosEnc(c)
        self.blocks = nn.ModuleList([CoaTBlock(c, self.cpe) for _ in range(3)])
        self.head = nn.Linear(c, 10)

    def forward(self, x):
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x.mean(dim=(2, 3)))


class HaloNetish(nn.Module):
    """HaloNet (timm): each block's queries attend to its neighbourhood with a halo, cut by
    x.unfold(2, win, block).unfold(3, win, block)."""

    def __init__(self, c=8, block=4, halo=1):
        super().__init__()
        self.block, self.halo, self.win = block, halo, block + 2 * halo
        self.stem = nn.Conv2d(3, c, 3, 2, 1)
        self.q = nn.Conv2d(c, c, 1)
        self.kv = nn.Conv2d(c, 2 * c, 1)

    def forward(self, x):
        x = self.stem(x)
        B, C, H, W = x.shape
        b, win, nh, nw = self.block, self.win, H // self.block, W // self.block
        q = self.q(x).reshape(B, C, nh, b, nw, b).permute(0, 2, 4, 3, 5, 1)
        q = q.reshape(B, nh * nw, b * b, C)
        kv = F.pad(self.kv(x), [self.halo] * 4)
        kv = kv.unfold(2, win, b).unfold(3, win, b)             # B, 2C, nh, nw, win, win
        kv = kv.reshape(B, 2 * C, nh * nw, win * win).permute(0, 2, 3, 1)
        k, v = kv.split([C, C], dim=-1)
        attn = (q @ k.transpose(-1, -2) * C ** -0.5).softmax(dim=-1)
        out = (attn @ v).reshape(B, nh, nw, b, b, C).permute(0, 5, 1, 3, 2, 4)
        return out.reshape(B, C, H, W)


class ASPP(nn.Module):
    def __init__(self, cin, c):
        super().__init__()
        self.b0 = nn.Sequential(nn.Conv2d(cin, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.b = nn.ModuleList([nn.Sequential(nn.Conv2d(cin, c, 3, padding=r, dilation=r, bias=False), nn.BatchNorm2d(c), nn.ReLU()) for r in (2, 3)])
        self.pool = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(cin, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU())
        self.project = nn.Sequential(nn.Conv2d(4*c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(), nn.Dropout(0.5))

    def forward(self, x):
        size = x.shape[-2:]
        res = [self.b0(x)] + [b(x) for b in self.b]
        res.append(F.interpolate(self.pool(x), size=size, mode="bilinear", align_corners=False))
        return self.project(torch.cat(res, 1))


class DeepLabish(nn.Module):
    """DeepLabV3: ASPP (dilated convs, image pooling) and bilinear upsampling to the input."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1), nn.ReLU(), nn.Conv2d(16, 16, 3, 2, 1), nn.ReLU())
        self.aspp = ASPP(16, 8)
        self.cls = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        y = self.cls(self.aspp(self.backbone(x)))
        return F.interpolate(y, size=x.shape[-2:], mode="bilinear", align_corners=False)

class FPNish(nn.Module):
    """FPN: lateral 1x1 convs, nearest top-down upsampling, a stride-2 extra level."""

    def __init__(self):
        super().__init__()
        self.c = nn.ModuleList([nn.Conv2d(3, 8, 3, 2, 1), nn.Conv2d(8, 16, 3, 2, 1), nn.Conv2d(16, 32, 3, 2, 1)])
        self.lat = nn.ModuleList([nn.Conv2d(ch, 8, 1) for ch in (8, 16, 32)])
        self.out = nn.ModuleList([nn.Conv2d(8, 8, 3, padding=1) for _ in range(3)])

    def forward(self, x):
        feats = []
        for c in self.c:
            x = F.relu(c(x))
            feats.append(x)
        last = self.lat[2](feats[2])
        outs = [self.out[2](last)]
        for i in (1, 0):
            lat = self.lat[i](feats[i])
            top = F.interpolate(last, size=lat.shape[-2:], mode="nearest")
            last = lat + top
            outs.insert(0, self.out[i](last))
        outs.append(F.max_pool2d(outs[-1], 1, 2, 0))
        return tuple(outs)

class CRNNish(nn.Module):
    """CRNN: conv features permuted to a sequence over the width, Linear, log_softmax."""

    def __init__(self):
        super().__init__()
        self.cnn = nn.Sequential(nn.Conv2d(1, 8, 3, 1, 1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2, 2),
                              nn.Conv2d(8, 16, 3, 1, 1), nn.ReLU(), nn.MaxPool2d((2, 1), (2, 1)))
        self.fc = nn.Linear(16 * 8, 11)

    def forward(self, x):                         # N, 1, 32, W
        y = self.cnn(x)                           # N, 16, 8, W/2
        n, c, h, w = y.shape
        y = y.permute(0, 3, 1, 2).reshape(n, w, c * h)
        return F.log_softmax(self.fc(y), dim=2).permute(1, 0, 2)

class SE(nn.Module):
    def __init__(self, c, r):
        super().__init__()
        self.f1 = nn.Conv2d(c, r, 1)
        self.f2 = nn.Conv2d(r, c, 1)

    def forward(self, x):
        return x * torch.sigmoid(self.f2(F.silu(self.f1(F.adaptive_avg_pool2d(x, 1)))))


class MBConv(nn.Module):
    def __init__(self, cin, cout, k, stride, e):
        super().__init__()
        mid = cin * e
        self.expand = nn.Sequential(nn.Conv2d(cin, mid, 1, bias=False), nn.BatchNorm2d(mid), nn.SiLU()) if e != 1 else nn.Identity()
        self.dw = nn.Sequential(nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid, bias=False), nn.BatchNorm2d(mid), nn.SiLU())
        self.se = SE(mid, max(1, cin // 4))
        self.proj = nn.Sequential(nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.res = stride == 1 and cin == cout

    def forward(self, x):
        y = self.proj(self.se(self.dw(self.expand(x))))
        return y + x if self.res else y


class EfficientNetish(nn.Module):
    """EfficientNet-B0: MBConv blocks (expand, depthwise, SE with SiLU, project)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.SiLU())
        self.blocks = nn.Sequential(MBConv(16, 8, 3, 1, 1), MBConv(8, 12, 3, 2, 6), MBConv(12, 12, 5, 1, 6), MBConv(12, 20, 5, 2, 6))
        self.head = nn.Sequential(nn.Conv2d(20, 32, 1, bias=False), nn.BatchNorm2d(32), nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.2), nn.Linear(32, 10))

    def forward(self, x): return self.head(self.blocks(self.stem(x)))

class HRNetish(nn.Module):
    """HRNet: a high and a low resolution branch exchanging features both ways."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.BatchNorm2d(8), nn.ReLU())
        self.hi = nn.Sequential(nn.Conv2d(8, 8, 3, 1, 1), nn.BatchNorm2d(8), nn.ReLU())
        self.lo = nn.Sequential(nn.Conv2d(8, 16, 3, 2, 1), nn.BatchNorm2d(16), nn.ReLU())
        self.lo2hi = nn.Sequential(nn.Conv2d(16, 8, 1, bias=False), nn.BatchNorm2d(8))
        self.hi2lo = nn.Sequential(nn.Conv2d(8, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16))
        self.final = nn.Conv2d(24, 4, 1)

    def forward(self, x):
        x = self.stem(x)
        h = self.hi(x)
        l = self.lo(x)
        h2 = F.relu(h + F.interpolate(self.lo2hi(l), scale_factor=2, mode="nearest"))
        l2 = F.relu(l + self.hi2lo(h))
        up = F.interpolate(l2, size=(h2.size(2), h2.size(3)), mode="bilinear", align_corners=True)
        return self.final(torch.cat([h2, up], 1))

class TransformerEnc(nn.Module):
    """nn.TransformerEncoder of two nn.TransformerEncoderLayer (post- or pre-norm)."""

    def __init__(self, norm_first):
        super().__init__()
        self.inp = nn.Linear(12, 16)
        self.enc = nn.TransformerEncoder(nn.TransformerEncoderLayer(16, 4, 32, dropout=0.1, batch_first=True, norm_first=norm_first), 2, enable_nested_tensor=False)
        self.cls = nn.Linear(16, 3)

    def forward(self, x):
        return self.cls(self.enc(self.inp(x)).mean(1))


class TransformerEncPre(TransformerEnc):
    def __init__(self): super().__init__(True)


class TransformerEncPost(TransformerEnc):
    def __init__(self): super().__init__(False)

class AudioNet(nn.Module):
    """A 1-D audio net: strided, dilated and grouped Conv1d, pools, amax over time."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(1, 8, 9, 4, 4), nn.BatchNorm1d(8), nn.ReLU(), nn.MaxPool1d(4),
                              nn.Conv1d(8, 16, 5, 1, 2, dilation=1), nn.BatchNorm1d(16), nn.ReLU(),
                              nn.Conv1d(16, 16, 3, 1, 2, dilation=2, groups=4), nn.ReLU(), nn.AvgPool1d(2))
        self.fc = nn.Linear(16, 6)

    def forward(self, x):
        y = self.net(x)
        return self.fc(torch.amax(y, dim=-1))

class AutoEncoder(nn.Module):
    """A convolutional autoencoder, decoding with ConvTranspose2d (output_padding)."""

    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Conv2d(3, 8, 3, 2, 1), nn.ReLU(), nn.Conv2d(8, 16, 3, 2, 1), nn.ReLU())
        self.dec = nn.Sequential(nn.ConvTranspose2d(16, 8, 3, 2, 1, output_padding=1), nn.ReLU(),
                              nn.ConvTranspose2d(8, 3, 4, 2, 1), nn.Sigmoid())

    def forward(self, x): return self.dec(self.enc(x))

class MiscOps(nn.Module):
    """mean / amax / amin / std over dims, where, clamp, masked_fill, softmax, F.normalize."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        m = torch.mean(y, dim=(2, 3), keepdim=True)
        a = torch.amax(y, dim=1, keepdim=True)
        z = torch.where(y > m, y, torch.clamp(y, -0.5, 0.5))
        z = z.masked_fill(y < -1.0, 0.0)
        sm = torch.softmax(z, dim=1) + torch.softmax(z, dim=-1)
        n = F.normalize(sm.flatten(2), dim=-1)
        return n, a.amin(dim=(2, 3)), y.clamp(min=0).sum(1), y.std(dim=1)

class SuperRes(nn.Module):
    """Super-resolution: convolutions, then pixel_shuffle by 3 (ESPCN)."""

    def __init__(self, r=3):
        super().__init__()
        self.c1 = nn.Conv2d(1, 16, 5, padding=2)
        self.c2 = nn.Conv2d(16, 8, 3, padding=1)
        self.c3 = nn.Conv2d(8, r*r, 3, padding=1)
        self.ps = nn.PixelShuffle(r)

    def forward(self, x):
        y = torch.tanh(self.c2(torch.tanh(self.c1(x))))
        return self.ps(self.c3(y)).clamp(0, 1)

class GNBlock(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.n1 = nn.GroupNorm(4, cin)
        self.c1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.n2 = nn.GroupNorm(4, cout)
        self.c2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x):
        y = self.c1(F.silu(self.n1(x)))
        y = self.c2(F.silu(self.n2(y)))
        return y + self.skip(x)


class UNetish(nn.Module):
    """A UNet with GroupNorm + SiLU residual blocks and a ConvTranspose up-step."""

    def __init__(self):
        super().__init__()
        self.inc = nn.Conv2d(3, 8, 3, padding=1)
        self.d1 = GNBlock(8, 16)
        self.down = nn.Conv2d(16, 16, 3, 2, 1)
        self.mid = GNBlock(16, 16)
        self.up = nn.ConvTranspose2d(16, 16, 2, 2)
        self.u1 = GNBlock(32, 8)
        self.out = nn.Conv2d(8, 3, 1)

    def forward(self, x):
        h = self.d1(self.inc(x))
        m = self.mid(self.down(h))
        u = self.u1(torch.cat([self.up(m), h], 1))
        return self.out(u)

class ComputedPool(nn.Module):
    """Pooling kernels computed from the input size: pnnx writes aten::avg_pool2d /
    aten::max_pool2d with every argument an input."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        y = self.conv(x)
        a = F.avg_pool2d(y, kernel_size=(y.size(2) // 2, y.size(3) // 2))
        b = F.max_pool2d(y, kernel_size=(y.size(2), y.size(3)))
        return a, b

class ChannelShuffleFn(nn.Module):
    """F.channel_shuffle (aten::channel_shuffle, groups an input) between two convolutions."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Conv2d(6, 6, 1, groups=3), nn.Conv2d(6, 6, 3, padding=1, groups=2)

    def forward(self, x):
        return self.b(F.channel_shuffle(self.a(x), 3))


MODELS = {
    "resnet50ish": (ResNet50ish, [(1, 3, 64, 64)]),
    "densenetish": (DenseNetish, [(1, 3, 64, 64)]),
    "shufflenetv2ish": (ShuffleNetV2ish, [(1, 3, 64, 64)]),
    "squeezenetish": (SqueezeNetish, [(1, 3, 75, 75)]),
    "googlenetish": (GoogLeNetish, [(1, 3, 64, 64)]),
    "regnetish": (RegNetish, [(2, 3, 64, 64)]),
    "convnextish": (ConvNeXtish, [(1, 3, 64, 64)]),
    "swinish": (Swinish, [(1, 3, 64, 64)]),
    "mobilevitish": (MobileViTish, [(1, 3, 64, 64)]),
    "mobilevitv2ish": (MobileViTv2ish, [(1, 3, 32, 48)]),
    "coatish": (CoaTish, [(1, 3, 32, 32)]),
    "halonetish": (HaloNetish, [(2, 3, 32, 48)]),
    "deeplabish": (DeepLabish, [(1, 3, 64, 64)]),
    "fpnish": (FPNish, [(1, 3, 64, 64)]),
    "crnnish": (CRNNish, [(1, 1, 32, 96)]),
    "efficientnetish": (EfficientNetish, [(1, 3, 64, 64)]),
    "hrnetish": (HRNetish, [(1, 3, 64, 64)]),
    "transformer_pre": (TransformerEncPre, [(2, 10, 12)]),
    "transformer_post": (TransformerEncPost, [(2, 10, 12)]),
    "audionet": (AudioNet, [(2, 1, 1600)]),
    "autoencoder": (AutoEncoder, [(1, 3, 64, 64)]),
    "miscops": (MiscOps, [(2, 3, 16, 16)]),
    "superres": (SuperRes, [(1, 1, 32, 32)]),
    "unetish": (UNetish, [(1, 3, 64, 64)]),
    "computedpool": (ComputedPool, [(1, 3, 12, 10)]),
    "channelshuffle_fn": (ChannelShuffleFn, [(1, 6, 5, 4)]),
}
