"""One convolution's weights, packed for the fast kernels, and the kernel chosen per size.

    packed = PackedConv2d(weight, bias, stride, dilation, groups)
    y = packed.run(x, pads, out_hw, activation, residual)     # (N, C_out, Ho, Wo)

Which algorithm runs depends on the convolution and on its input's size: the first entry of
the table in layers/fast/algorithms.py that fits and pays (the rules are listed there).
Each packing is made the first time it is needed (at build, when the graph plans its
shapes; a large one that a size first met in a forward needs, by a background thread:
``packing``) and kept; a packing that replaces the weight gives back the pages of the
memory-mapped weight it was made from. Each call (the algorithm, its packed weight and the
kernel's arguments) is worked out once per input shape and kept too, for at most MAX_SIZES
shapes (layers.base's ``remember``): a process fed ever new sizes does not grow without end.
"""

from __future__ import annotations

import os
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout   # the builtin from 3.11

import numpy as np

from layers.base import building, remember
from layers.fast import algorithms
from layers.fast.algorithms import BY_NAME, Call, Pair, Pads, packing_of
from layers.fast.epilogue import Activation
from layers.fast.operands import check
from layers.fast.team import work_alone
from parser.errors import ShapeError
from parser.bin import release_pages

WINOGRAD = ("winograd", "winograd_f2")      # its two variants, one packing each


class PackedConv2d:
    """The weight of one convolution in the layouts its kernels read; bias as float32."""

    def __init__(self, weight: np.ndarray, bias: np.ndarray | None, stride: Pair,
                 dilation: Pair, groups: int, winograd: bool = True, once: bool = False):
        self.weight, self.stride, self.dilation, self.groups = weight, stride, dilation, groups
        self.c_out, c_group, *kernel = weight.shape
        self.c_in, self.kernel = c_group * groups, tuple(kernel)
        self.bias = None if bias is None else np.array(bias, np.float32)   # writable copy
        self.depthwise = groups == self.c_in and c_group == 1 and groups > 1
        self.pointwise = self.kernel == (1, 1) and stride == (1, 1) and groups == 1
        self.winograd_ok = winograd and (self.kernel == (3, 3) and stride == (1, 1)
                            and dilation == (1, 1) and groups == 1)
        self.once = once                         # run once: packed in the call, not later
        self._packs: dict[str, np.ndarray] = {}
        self._packing: dict[str, Future[np.ndarray]] = {}   # packed in the background
        self._pack_locks: dict[str, threading.Lock] = {}
        self._guessed: list[str] = []            # Winograd packed at build for any size
        self._calls: dict[tuple, Call] = {}      # call_for's, by input shape and geometry
        self._chosen: dict[tuple[int, Pair], str] = {}   # algorithm's, by batch and out_hw
        self._lock = threading.Lock()
        _EVERY.add(self)                          # its locks are new in a forked child

    def algorithm(self, batch: int, out_hw: Pair) -> str:
        """The name of the algorithm that runs this many images of this output size
        ('depthwise', 'winograd', 'gemm', ...: layers/fast/algorithms.py), chosen once and
        remembered."""
        name = self._chosen.get((batch, out_hw))
        if name is None:
            name = algorithms.choose(self, batch, out_hw).name
            remember(self._chosen, (batch, out_hw), name)
        return name

    def packed(self, algorithm: str) -> np.ndarray:
        """The weight packed for ``algorithm``, made on first use (one lock per packing: a
        packing made in the background holds up no other). Algorithms that read another's
        packing (``Algorithm.packing``) share it: one copy, made once."""
        name = packing_of(algorithm)
        pack = self._packs.get(name)
        if pack is None:
            with self._lock:
                lock = self._pack_locks.setdefault(name, threading.Lock())
            with lock:
                pack = self._packs.get(name)
                if pack is None:
                    entry = BY_NAME[name]
                    pack = self._packs[name] = entry.pack(self)
                    if entry.releases_weight:
                        release_pages(self.weight)   # read again only if im2col runs it
        return pack

    def has_packed(self, algorithm: str) -> bool:
        """Whether the weight is packed for ``algorithm`` (``packed`` would not pack it)."""
        return packing_of(algorithm) in self._packs

    def packing_failed(self, algorithm: str) -> bool:
        """Whether packing it in the background (``packing``) was asked and failed."""
        future = self._packing.get(packing_of(algorithm))
        return future is not None and future.done() and future.exception() is not None

    def packing(self, algorithm: str) -> Future[np.ndarray]:
        """The weight packed for ``algorithm``, as a future: done if it is packed, else
        packed by a background thread (one for the process), asked once (again in a forked
        child, which has not the parent's thread: ``_forget_packings_after_fork``)."""
        name = packing_of(algorithm)
        with self._lock:
            future = self._packing.get(name)
            if future is None:
                if name in self._packs:
                    future = Future()
                    future.set_result(self._packs[name])
                else:
                    future = _packer().submit(self.packed, name)
                self._packing[name] = future
        return future

    def _forget_packings(self) -> None:
        """In a forked child: the parent's futures are dropped unread (their locks may be
        held by its thread), so what it had not packed is asked again; the locks (which
        another of the parent's threads may have held) are new."""
        self._lock = threading.Lock()
        self._pack_locks = {}
        self._packing = {}

    def load_candidate_kernels(self) -> None:
        """Load the compiled kernels of every algorithm this convolution may run (which one
        depends on the input size): at build, so that a graph whose shapes are known only
        when it runs does not load them in its first inference."""
        for entry in algorithms.candidates(self):
            load_kernels(entry.name)

    def prepare_for_any_size(self) -> None:
        """Pack now what any input size is likely to need, for a graph whose shapes are
        known only when it runs (the algorithms' ``pack_at_build``)."""
        for entry in algorithms.candidates(self):
            if entry.pack_at_build is not None and entry.pack_at_build(self):
                self.packed(entry.name)
        self._guessed = [name for name in self._packs if name in WINOGRAD]

    def prepare(self, batch: int, out_hw: Pair) -> None:
        """Pack what ``run`` will need for this size now (at build) rather than mid-forward,
        and load its compiled kernels. The first size planned lets go of the Winograd
        packings made at build for any size (F(4x4)'s, and F(2x2)'s beside it where
        algorithms.py packs both) that it does not take if it takes an algorithm that packs
        a copy of its own (F(4x4)'s is 4x the weights; gemm's is the weight): before it packs
        its own, so no two are held together after it; a later size that needs one packs it
        again.
        A packing the table makes later (``packs_later``: large gemm_transposed panels and
        F(2x2) products) is made here only at build (``layers.base.building``); a size met
        first in a forward leaves it to the call, which has it made in the background after
        its first run."""
        algorithm = self.algorithm(batch, out_hw)
        with self._lock:
            if packing_of(algorithm) != "gemm":   # gemm's packing is the weight itself
                for name in self._guessed:
                    if name != algorithm:
                        del self._packs[name]
            self._guessed = []
        if not BY_NAME[algorithm].packed_later(self) or building():
            self.packed(algorithm)
        load_kernels(algorithm)

    def run(self, x: np.ndarray, pads: Pads, out_hw: Pair, activation: Activation,
            residual: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
        """x (N, C_in, H, W) -> activation(conv(x) + bias + residual) (N, C_out, Ho, Wo);
        pads are (top, bottom, left, right) zeros around x. ``out``: a C-contiguous float32
        array of the output's shape to write into (not overlapping x or residual), or None
        for a new one."""
        x = kernel_layout(x)
        shape = (x.shape[0], self.c_out, *out_hw)
        if x.ndim != 4 or x.shape[1] != self.c_in or (residual is not None
                                                      and residual.shape != shape):
            raise ShapeError(f"convolution of {self.c_in} input channels into {shape}: input "
                             f"{x.shape}, residual {getattr(residual, 'shape', None)}")
        if residual is not None:
            residual = kernel_layout(residual)
        if out is None:
            y = np.empty(shape, np.float32)
        else:                          # the kernels write it as laid out: refuse any other
            check(out, shape, "convolution output", writeable=True)
            y = out
        self.call_for(x.shape, pads, out_hw, activation)(x, residual, y)
        return y

    def call_for(self, x_shape: tuple[int, ...], pads: Pads, out_hw: Pair,
                 activation: Activation) -> Call:
        """This convolution for inputs of ``x_shape``, as a call ``(x, residual, y)`` that
        writes y: the algorithm, its packed weight and the kernel's arguments are worked out
        once per shape and remembered (a forward asks for the same shapes every time)."""
        key = (x_shape, pads, out_hw, activation.code, activation.a, activation.b)
        call = self._calls.get(key)
        if call is None:
            call = remember(self._calls, key, self._make_call(x_shape[0], pads, out_hw, activation))
        return call

    def _make_call(self, batch: int, pads: Pads, out_hw: Pair, activation: Activation) -> Call:
        return BY_NAME[self.algorithm(batch, out_hw)].make_call(self, pads, out_hw, activation)


_EVERY: weakref.WeakSet[PackedConv2d] = weakref.WeakSet()   # every PackedConv2d
_PACKER: list[ThreadPoolExecutor] = []       # the packing thread, once made
_PACKER_MADE = threading.Lock()
PACKINGS_WAIT_S = 120.0                      # background_packings_made's wait, at most


def _packer() -> ThreadPoolExecutor:
    """The thread that packs weights in the background (PackedConv2d.packing): one for the
    process, made on first use; it works alone (team.work_alone), beside the forwards."""
    with _PACKER_MADE:
        if not _PACKER:
            _PACKER.append(ThreadPoolExecutor(1, thread_name_prefix="pnnx-infer-pack",
                                              initializer=work_alone))
        return _PACKER[0]


def background_packings_made(timeout: float = PACKINGS_WAIT_S) -> bool:
    """Wait until the packing thread has made every packing handed to it so far (it takes
    them in turn; a forward hands over what it asked for when it gives back its helper
    threads); False if it is still at work after ``timeout`` seconds, or takes no more work
    (at interpreter exit)."""
    with _PACKER_MADE:
        packer = _PACKER[0] if _PACKER else None
    if packer is None:
        return True
    try:
        packer.submit(lambda: None).result(timeout)
    except (FutureTimeout, RuntimeError):       # still busy; or no new work at exit
        return False
    return True


def _forget_packings_after_fork() -> None:
    """A forked child has not the parent's packing thread: it starts its own, and asks again
    for what the parent's had not packed (as workers.py forgets the parent's teams)."""
    global _PACKER_MADE
    _PACKER_MADE = threading.Lock()
    _PACKER.clear()
    for conv in list(_EVERY):
        conv._forget_packings()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_packings_after_fork)


def kernel_layout(x: np.ndarray, writeable: bool = True) -> np.ndarray:
    """x as the kernels take it: float32, C-contiguous, aligned, and writeable unless
    ``writeable`` is False (for a kernel that only reads it); a copy if not."""
    flags = x.flags
    if (x.dtype == np.float32 and flags.c_contiguous and flags.aligned
            and (flags.writeable or not writeable)):
        return x                                   # nearly always: no np.require
    return np.require(x, np.float32, ("C", "A", "W") if writeable else ("C", "A"))


def load_kernels(algorithm: str) -> None:
    """Load ``algorithm``'s compiled kernels now, with one tiny call (once per process)."""
    algorithms.warm(algorithm)
