"""What the compiled kernels depend on in this CPU, read once from the operating system.

``cpu_description()`` gives the CPU's model and instruction sets: aot.py hashes it into the
name of the modules it compiles for exactly this CPU, and simd.py reads the width of the
vector registers from it. ``level2_cache_bytes()`` is the level-2 cache, which the table
of convolution algorithms reads (algorithms.py). It imports nothing of layers.fast.
"""

from __future__ import annotations

import functools
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


LEVEL2_UNKNOWN = 1 << 20     # bytes: the level-2 cache assumed where the OS does not say
CACHES = Path("/sys/devices/system/cpu/cpu0/cache")


@functools.cache
def level2_cache_bytes() -> int:
    """The level-2 cache (data or unified) of the first core, as Linux's sysfs gives it
    (``index2/size``: "2048K"; a core's own, or the whole of one its cluster shares);
    LEVEL2_UNKNOWN where no readable entry says (another OS)."""
    for index in sorted(CACHES.glob("index*")):
        try:
            if ((index / "level").read_text().strip() == "2"
                    and (index / "type").read_text().strip() in ("Data", "Unified")):
                return _bytes((index / "size").read_text().strip())
        except (OSError, ValueError):        # an entry not readable: the next one
            continue
    return LEVEL2_UNKNOWN


def _bytes(size: str) -> int:
    """sysfs's "2048K", "1M" or "524288" as bytes."""
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:].upper(), 1)
    return int(size[:-1] if scale > 1 else size) * scale
