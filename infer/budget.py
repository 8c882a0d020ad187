"""The memory budget: how many bytes the arrays of one forward pass may take.

Shape planning knows every operand's size before anything runs, so a model that would need
more memory than the machine has (an upsample by 4000, ``torch.arange`` to 1e12, a padding of
1e5) is refused with a MemoryBudgetError naming the operator and the size, before a byte is
allocated, instead of failing half-way with a bare MemoryError or being killed by the OS.

What is checked against the budget:
  - every operand, as its operator's shape is planned (before the operator computes values or
    packs weights for that size, which would allocate it);
  - the peak of a forward pass: the most bytes alive at once, walking the run list with each
    operand alive from its step to its last reader (graph inputs and outputs throughout);
  - a graph input that must be copied (made contiguous, cast), before the copy.

The budget, in bytes: ``RuntimeGraph(..., memory_budget=...)`` or ``graph.memory_budget``,
else the environment variable PNNX_INFER_MEMORY_BUDGET ("6G", "512M", "1.5GiB", a number of
bytes, or "unlimited"), else half the memory this process may use: the smallest of physical
memory, the cgroup limit of its container, and its RLIMIT_AS / RLIMIT_DATA.
"""

from __future__ import annotations

import math
import os
import re
from pathlib import Path

import numpy as np

from parser.errors import GraphError

ENV = "PNNX_INFER_MEMORY_BUDGET"
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
_SIZE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]?)(?:i?b)?\s*", re.IGNORECASE)
UNLIMITED = math.inf
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max",                     # cgroup v2
                  "/sys/fs/cgroup/memory/memory.limit_in_bytes")    # cgroup v1


def parse_size(text: str | int | float) -> float:
    """Bytes from ``"6G"``, ``"512 MiB"``, ``"1.5GB"``, ``"2e9"``, ``1000000`` or
    ``"unlimited"`` (units are powers of 1024). A GraphError says what is accepted."""
    if isinstance(text, (int, float, np.integer, np.floating)) and not isinstance(text, bool):
        if 0 < text < math.inf:
            return float(text) if text < 1e300 else UNLIMITED    # float(10**400) overflows
    elif isinstance(text, str):
        if text.strip().lower() in ("unlimited", "none", "inf"):
            return UNLIMITED
        match = _SIZE.fullmatch(text)
        if match:
            size = float(match.group(1)) * UNITS[match.group(2).lower()]
            if 0 < size < math.inf:
                return size
    raise GraphError(f"a memory budget is a positive size like 6G, 512M, 1.5GiB or a number "
                     f"of bytes, or 'unlimited'; got {str(text)[:40]!r}")


def machine_memory() -> int:
    """Bytes this process may use: the smallest of physical memory, the cgroup limit and the
    address-space / data rlimits (those that are set)."""
    limits = []
    try:
        limits.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    for path in _CGROUP_LIMITS:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            limits.append(int(text))
    try:
        import resource

        for which in (resource.RLIMIT_AS, resource.RLIMIT_DATA):
            soft = resource.getrlimit(which)[0]
            if soft != resource.RLIM_INFINITY and soft > 0:
                limits.append(soft)
    except (ImportError, OSError, ValueError):
        pass
    return min(limits) if limits else 8 << 30


def default_budget() -> float:
    """The budget when a graph sets none: PNNX_INFER_MEMORY_BUDGET, else half of
    ``machine_memory()``."""
    text = os.environ.get(ENV)
    if text:
        try:
            return parse_size(text)
        except GraphError as error:
            raise GraphError(f"{ENV}: {error.message}") from None
    return machine_memory() // 2


def describe(nbytes: float) -> str:
    """A size for people: 1.9 GiB, 7.0 TiB, 512 B."""
    if nbytes == UNLIMITED:
        return "unlimited"
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= size:
            return f"{nbytes / size:.1f} {unit}"
    return f"{int(nbytes)} B"


def over_budget(what: str, nbytes: float, budget: float) -> str:
    """The message for ``what`` needing ``nbytes`` over ``budget``."""
    return (f"{what} needs {describe(nbytes)} ({int(nbytes):,} bytes), more than the memory "
            f"budget of {describe(budget)}; check the input shapes and the model's sizes, or "
            f"raise the budget (graph.memory_budget, or the environment variable {ENV})")
