"""The fixed cost of a forward: the Python around the kernels, on a graph whose kernels have
almost nothing to compute.

FIXED_OPERATORS operators on a 1x8x4x4 input, ten times ``conv 3x3 -> sigmoid -> mul``
(c * sigmoid(c): the convolution's output read twice, so nothing fuses)::

    x -> Conv2d -> c -> Sigmoid -> s -> mul(c, s) -> x' ...

Every operand's shape and dtype is written as pnnx writes them, so the memory plan covers
the graph as it covers an exported model's.

The median latency of this runtime's forward on it, in a worker process as every measurement
(``run.fixed_cost``), is the fixed cost per forward of a 30-operator graph.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np

FIXED_OPERATORS = 30
INPUT_SHAPE = (1, 8, 4, 4)
FIXED_COST_TARGET_MS = 0.3


def write_model(folder: Path) -> tuple[Path, Path]:
    """The pnnx files of the FIXED_OPERATORS-operator graph (seeded weights)."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    channels = INPUT_SHAPE[1]
    annotation = f"({','.join(map(str, INPUT_SHAPE))})f32"   # every operand's shape and dtype
    lines, weights = [f"pnnx.Input in0 0 1 a0 #a0={annotation}"], {}
    for i in range(FIXED_OPERATORS // 3):
        lines += [f"nn.Conv2d conv{i} 1 1 a{i} c{i} bias=True dilation=(1,1) groups=1 "
                  f"in_channels={channels} kernel_size=(3,3) out_channels={channels} "
                  f"padding=(1,1) padding_mode=zeros stride=(1,1) "
                  f"@weight=({channels},{channels},3,3)f32 @bias=({channels})f32 "
                  f"#a{i}={annotation} #c{i}={annotation}",
                  f"nn.Sigmoid sig{i} 1 1 c{i} s{i} #c{i}={annotation} #s{i}={annotation}",
                  f"pnnx.Expression mul{i} 2 1 c{i} s{i} a{i + 1} expr=mul(@0,@1) "
                  f"#c{i}={annotation} #s{i}={annotation} #a{i + 1}={annotation}"]
        weights[f"conv{i}.weight"] = rng.standard_normal((channels, channels, 3, 3),
                                                         dtype=np.float32) * 0.1
        weights[f"conv{i}.bias"] = rng.standard_normal(channels, dtype=np.float32)
    last = FIXED_OPERATORS // 3
    lines.append(f"pnnx.Output out0 1 0 a{last} #a{last}={annotation}")
    param, binary = folder / "fixed_cost.pnnx.param", folder / "fixed_cost.pnnx.bin"
    param.write_text(f"7767517\n{len(lines)} {FIXED_OPERATORS + 1}\n"
                     + "\n".join(lines) + "\n")
    with zipfile.ZipFile(binary, "w", zipfile.ZIP_STORED) as archive:
        for name, array in weights.items():
            archive.writestr(name, array.tobytes())
    return param, binary
