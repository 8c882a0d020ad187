"""The check of newly compiled kernel modules, run in a child process of the build.

    python -m layers.fast.check STAGING     # exit 0: the modules run on this CPU

layers/fast/aot.py builds new modules into a staging folder and runs this before moving them
where other processes find them: it binds the modules (those in STAGING first, the others
from the cache folder) without building anything, and makes one tiny call of every
convolution algorithm (``algorithms.warm``). Code with an instruction this CPU lacks kills
this process (SIGILL), not a user's. A module of its own, imported by nobody: it needs the
kernels' users (algorithms.py), which the builder must not import.
"""

from __future__ import annotations

import sys
from pathlib import Path

from layers.fast import algorithms, aot, backend


def check(staging: Path) -> None:
    """Bind the modules found in ``staging`` or the cache, and run every algorithm once."""
    kernels = aot.load_from(staging, aot.cache_dir())
    if kernels is None:
        raise SystemExit(f"the kernel modules are not all in {staging} or {aot.cache_dir()}")
    backend.use_compiled(kernels)
    for name in algorithms.BY_NAME:
        algorithms.warm(name)


if __name__ == "__main__":
    check(Path(sys.argv[1]))
