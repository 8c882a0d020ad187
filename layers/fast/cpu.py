"""What the compiled kernels depend on in this CPU, read once from the operating system.

``cpu_description()`` gives the CPU's model and instruction sets: aot.py hashes it into the
name of the modules it compiles for exactly this CPU, and simd.py reads the width of the
vector registers from it. It imports nothing of layers.fast.
"""

from __future__ import annotations

import platform
from pathlib import Path


def cpu_description() -> str:
    """This CPU's model and instruction sets (the module is compiled for exactly this CPU;
    simd.py reads the tile width from it)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.machine() + platform.processor()
    wanted = ("model name", "flags", "Features", "CPU part")
    return "\n".join(dict.fromkeys(line for line in lines if line.startswith(wanted)))
