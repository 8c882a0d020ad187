"""Squeeze-and-excitation (layers/excitation.py) in numba kernels, image by image::

    s[c] = sum(x[n, c]) / (H * W)
    h    = act(reduce @ s + reduce_bias)               reduce (S, C): C -> S
    g    = gate(expand @ h + expand_bias)              expand (C, S): S -> C
    y[n, c] = x[n, c] * g[c]             (+ x[n, c] if it keeps x, then + r[n, c]: a
                                          residual block, layers/excitation.py)

The sums (the means and the matrix-vector products' dot products) are float32 and taken in
vector lanes (reassociated), as BLAS takes them; the activations are the epilogue's
(epilogue.py's codes). x is read twice and y written once, as the separate pool and
multiply did. On a large block with helper threads (workers.Team.squeeze_excitation) the
means and the scaling are shared by planes (n, c), each thread's planes in one run, so
that a thread often reads planes a depthwise convolution before it left in its own cache;
the gates, a few matrix-vector products, stay on the calling thread. Every value is the
same sum either way.
"""

from __future__ import annotations

import functools

import numpy as np

from layers.fast.epilogue import IDENTITY, Activation, activate_row
from layers.fast.kernel import FLOAT, INT, array, kernel
from layers.fast.team import team_worth_sharing

SHARED_FROM = 1 << 17        # values of x: a smaller block runs faster on this thread alone


@kernel(nogil=True, exported=(array(3), array(3), array(2), array(1), INT, FLOAT, FLOAT,
                              array(2), array(1), INT, FLOAT, FLOAT, INT, array(3)))
def _squeeze_excitation(x, y, reduce, reduce_bias, act_code, act_a, act_b,
                        expand, expand_bias, gate_code, gate_a, gate_b, keep, residual):
    """x (N, C, L) -> y (N, C, L) (the module docstring); reduce (S, C), expand (C, S);
    ``keep``: 1 to add x back; ``residual``: y's shape, or no values for none. Each step
    of the sums rounded as torch rounds it (no fused multiply-add; the activations' own
    polynomials have theirs: epilogue.smooth_row)."""
    channels = x.shape[1]
    gates = np.empty((x.shape[0], channels), np.float32)
    for n in range(x.shape[0]):            # image by image: x read twice while in cache
        first, last = n * channels, (n + 1) * channels
        squeeze_planes(x, gates, first, last)
        excitation_gates(gates[n:n + 1], reduce, reduce_bias, act_code, act_a, act_b, expand,
                         expand_bias, gate_code, gate_a, gate_b)
        scale_planes(x, gates, y, keep, residual, first, last)


@kernel(nogil=True)
def squeeze_planes(x, means, first, last):
    """means[n, c] = sum(x[n, c]) / L for the planes p = n * C + c in first .. last - 1."""
    channels, length = x.shape[1], x.shape[2]
    for p in range(first, last):
        n, c = p // channels, p % channels
        means[n, c] = _sum(x[n, c]) / np.float32(length)


@kernel(nogil=True, exported=(array(2), array(2), array(1), INT, FLOAT, FLOAT, array(2),
                              array(1), INT, FLOAT, FLOAT))
def excitation_gates(means, reduce, reduce_bias, act_code, act_a, act_b, expand, expand_bias,
                     gate_code, gate_a, gate_b):
    """In place, image by image: means[n] (C,) -> gate(expand @ act(reduce @ means[n] +
    reduce_bias) + expand_bias)."""
    hidden = np.empty(reduce.shape[0], np.float32)
    for n in range(means.shape[0]):
        for s in range(reduce.shape[0]):
            hidden[s] = _dot(reduce[s], means[n]) + reduce_bias[s]
        activate_row(hidden, act_code, act_a, act_b)
        gate = means[n]
        for c in range(expand.shape[0]):          # every mean is read before a gate is written
            gate[c] = _dot(expand[c], hidden) + expand_bias[c]
        activate_row(gate, gate_code, gate_a, gate_b)


@kernel(nogil=True)
def scale_planes(x, gates, y, keep, residual, first, last):
    """y[n, c] = x[n, c] * gates[n, c] (then + x[n, c] if ``keep``, then + residual[n, c]
    where it has values) for the planes p = n * C + c in first .. last - 1."""
    channels, length = x.shape[1], x.shape[2]
    for p in range(first, last):
        n, c = p // channels, p % channels
        source, target, scale = x[n, c], y[n, c], gates[n, c]
        for i in range(length):
            target[i] = source[i] * scale
        if keep:
            for i in range(length):
                target[i] = source[i] + target[i]
        if residual.shape[0] > 0:
            other = residual[n, c]
            for i in range(length):
                target[i] = target[i] + other[i]


@kernel(nogil=True, fastmath={"reassoc"})          # reassoc: the sum vectorises
def _sum(row):
    """The sum of a float32 row, in float32."""
    total = np.float32(0.0)
    for i in range(row.shape[0]):
        total += row[i]
    return total


@kernel(nogil=True, fastmath={"reassoc"})
def _dot(a, b):
    """The dot product of two float32 rows of a's length, in float32."""
    total = np.float32(0.0)
    for i in range(a.shape[0]):
        total += a[i] * b[i]
    return total


NO_RESIDUAL = np.zeros((0, 0, 0), np.float32)


def squeeze_excitation(x: np.ndarray, out: np.ndarray, reduce: np.ndarray,
                       reduce_bias: np.ndarray, activation: Activation,
                       expand: np.ndarray, expand_bias: np.ndarray, gate: Activation,
                       keep: bool = False, residual: np.ndarray | None = None) -> None:
    """out (N, C, H, W) <- x's squeeze-and-excitation (+ x with ``keep``, + ``residual``,
    of x's shape); all C-contiguous float32 with N > 0 and H * W > 0.
    reduce (S, C) and expand (C, S) are the 1x1 weights as matrices (C-contiguous), biases
    (S,) and (C,) (zeros where the convolution has none)."""
    n, c, h, w = x.shape
    planes, y = x.reshape(n, c, h * w), out.reshape(n, c, h * w)
    residual = NO_RESIDUAL if residual is None else residual.reshape(n, c, h * w)
    team = team_worth_sharing(x.size, SHARED_FROM)
    if team is None:
        _squeeze_excitation(planes, y, reduce, reduce_bias, activation.code, activation.a,
                            activation.b, expand, expand_bias, gate.code, gate.a, gate.b,
                            int(keep), residual)
    else:
        team.squeeze_excitation(planes, y, reduce, reduce_bias, activation, expand,
                                expand_bias, gate, keep, residual)


@functools.cache
def load_kernel() -> None:
    """Run the kernel once on a tiny input so numba loads it now, at build."""
    one = np.ones((1, 1, 1, 1), np.float32)
    weight, bias = np.ones((1, 1), np.float32), np.zeros(1, np.float32)
    squeeze_excitation(one, np.empty_like(one), weight, bias, IDENTITY, weight, bias, IDENTITY)
