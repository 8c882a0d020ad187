"""Recurrent layers: nn.RNN, nn.LSTM and nn.GRU, as torch computes them.

A recurrent layer reads a sequence one step at a time and carries a hidden state h (and, for
the LSTM, a cell state c) from step to step. Per layer and direction, with W_i* the input
weights, W_h* the hidden weights and b_* their biases (pnnx names them weight_ih_l0,
weight_hh_l0, bias_ih_l0, bias_hh_l0; ``_reverse`` for the backward direction)::

    RNN    h' = act(W_ih x + b_ih + W_hh h + b_hh)               act = tanh or relu
    LSTM   i, f, g, o = split(W_ih x + b_ih + W_hh h + b_hh)    (4 * hidden rows, in that order)
           c' = sigmoid(f) * c + sigmoid(i) * tanh(g)
           h' = sigmoid(o) * tanh(c')                          (then W_hr h', with proj_size)
    GRU    r = sigmoid(W_ir x + b_ir + W_hr h + b_hr)
           z = sigmoid(W_iz x + b_iz + W_hz h + b_hz)
           n = tanh(W_in x + b_in + r * (W_hn h + b_hn))
           h' = (1 - z) * n + z * h

The input products W_ih x of all steps are one matrix product before the loop; only the
hidden products run step by step. With ``bidirectional`` a second pass reads the sequence
backwards and the two outputs are concatenated per step; with ``num_layers`` > 1 each layer
reads the previous layer's output. Shapes (``batch_first`` swaps the first two dims of x and
of the output; an unbatched x has no N)::

    x (L, N, input_size)  h0 (D * num_layers, N, H_out)  [c0 (D * num_layers, N, hidden)]
    -> output (L, N, D * H_out), h_n like h0, [c_n like c0]

with D = 2 if bidirectional else 1 and H_out = proj_size or hidden_size. pnnx writes the
initial states as extra inputs when the model passes them, and drops outputs nobody reads.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from layers.activation import sigmoid_inplace
from layers.base import Layer, Param, Shape, as_bool, as_int, as_str, at_least, expect_shape
from layers.registry import register_layer
from parser.errors import LayerError, ShapeError


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """sigmoid of a fresh array (a gate), computed in place by nn.Sigmoid's kernel."""
    sigmoid_inplace(x)
    return x


class _Recurrent(Layer):
    """What the three share: parameters, weights per layer and direction, shapes, the loop."""

    GATES = 1                        # rows of W_ih per hidden unit: 1 (RNN), 4 (LSTM), 3 (GRU)
    STATES = 1                       # h, or h and c
    input_size = Param(convert=at_least(1, as_int))
    hidden_size = Param(convert=at_least(1, as_int))
    num_layers = Param(1, at_least(1, as_int))
    bias = Param(True, as_bool)
    batch_first = Param(False, as_bool)
    bidirectional = Param(False, as_bool)
    one_blob_only = False

    @property
    def directions(self) -> int:
        return 2 if self.bidirectional else 1

    @property
    def output_size(self) -> int:
        return self.hidden_size

    def load_model(self, weights: dict[str, np.ndarray]) -> None:
        """Check and keep each layer's and direction's weights, as float32."""
        self.cells = []
        for layer in range(self.num_layers):
            inputs = self.input_size if layer == 0 else self.directions * self.output_size
            for suffix in ("", "_reverse")[:self.directions]:
                self.cells.append(self._cell_weights(weights, f"l{layer}{suffix}", inputs))

    def _cell_weights(self, weights: dict[str, np.ndarray], key: str, inputs: int
                      ) -> dict[str, np.ndarray]:
        rows = self.GATES * self.hidden_size
        expected: dict[str, tuple[int, ...]] = {f"weight_ih_{key}": (rows, inputs),
                                                f"weight_hh_{key}": (rows, self.output_size)}
        if self.bias:
            expected.update({f"bias_ih_{key}": (rows,), f"bias_hh_{key}": (rows,)})
        expected.update(self._extra_weights(key))
        cell: dict[str, np.ndarray] = {}
        for name, shape in expected.items():
            if name not in weights:
                raise LayerError(f"missing weight @{name}")
            array = np.asarray(weights[name], np.float32)
            expect_shape(f"@{name}", array.shape, shape)
            cell[name.rsplit("_" + key, 1)[0]] = array
        return cell

    def _extra_weights(self, key: str) -> dict[str, tuple[int, ...]]:
        return {}

    # ----- shapes ---------------------------------------------------------------------------
    def _state_shapes(self, batch: tuple[int, ...]) -> list[Shape]:
        layers = self.directions * self.num_layers
        return [(layers, *batch, self.output_size), (layers, *batch, self.hidden_size)]

    def _outputs(self) -> int:
        return 1 + self.STATES if self.num_outputs is None else self.num_outputs

    def infer_shapes(self, input_shapes: Sequence[Shape]) -> list[Shape]:
        if not 1 <= len(input_shapes) <= 1 + self.STATES:
            raise ShapeError(f"expects the sequence and at most {self.STATES} initial "
                             f"state(s), got {len(input_shapes)} inputs")
        x = tuple(input_shapes[0])
        if len(x) not in (2, 3) or x[-1] != self.input_size:
            raise ShapeError(f"expects (L, N, {self.input_size}) (or (L, {self.input_size}) "
                             f"unbatched), got {x}")
        batch = () if len(x) == 2 else ((x[0],) if self.batch_first else (x[1],))
        length = x[0] if len(x) == 2 or not self.batch_first else x[1]
        states = self._state_shapes(batch)[:self.STATES]
        for index, (given, want) in enumerate(zip(input_shapes[1:], states), start=1):
            if tuple(given) != want:
                raise ShapeError(f"initial state {index} has shape {tuple(given)}, expected "
                                 f"{want}")
        if len(input_shapes) not in (1, 1 + self.STATES):
            raise ShapeError(f"expects all {self.STATES} initial states or none")
        sequence = (length, *batch, self.directions * self.output_size)
        if batch and self.batch_first:
            sequence = (batch[0], length, sequence[-1])
        if self._outputs() > 1 + self.STATES:
            raise LayerError(f"gives the output and {self.STATES} state(s); the operator has "
                             f"{self._outputs()} outputs")
        return ([sequence] + states)[:self._outputs()]

    # ----- running --------------------------------------------------------------------------
    def forward(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        self.infer_shapes([np.shape(a) for a in inputs])
        x = np.asarray(inputs[0], np.float32)
        unbatched = x.ndim == 2
        if unbatched:
            x = x[:, None]
        elif self.batch_first:
            x = x.transpose(1, 0, 2)                              # (L, N, input_size)
        batch = x.shape[1]
        states = []
        for index, size in enumerate((self.output_size, self.hidden_size)[:self.STATES]):
            if len(inputs) > 1:
                state = np.asarray(inputs[1 + index], np.float32)
                states.append(state[:, None] if unbatched else state)
            else:
                states.append(np.zeros((self.directions * self.num_layers, batch, size),
                                       np.float32))
        finals: list[list[np.ndarray]] = [[] for _ in states]
        sequence = x
        for layer in range(self.num_layers):
            outputs = []
            for direction in range(self.directions):
                index = layer * self.directions + direction
                cell = self.cells[index]
                steps = sequence[::-1] if direction else sequence
                ys, last = self._run(cell, steps, [s[index] for s in states])
                outputs.append(ys[::-1] if direction else ys)
                for store, value in zip(finals, last):
                    store.append(value)
            sequence = np.concatenate(outputs, axis=-1)
        result = [sequence] + [np.stack(store) for store in finals]
        if unbatched:
            result = [result[0][:, 0]] + [s[:, 0] for s in result[1:]]
        elif self.batch_first:
            result[0] = result[0].transpose(1, 0, 2)
        return [np.ascontiguousarray(r) for r in result][:self._outputs()]

    def _input_products(self, cell: dict[str, np.ndarray], steps: np.ndarray) -> np.ndarray:
        """W_ih x + b_ih for every step at once: (L, N, rows)."""
        products: np.ndarray = steps @ cell["weight_ih"].T
        if self.bias:
            products += cell["bias_ih"]
        return products

    def _hidden_products(self, cell: dict[str, np.ndarray], h: np.ndarray) -> np.ndarray:
        """W_hh h + b_hh for one step: (N, rows)."""
        products: np.ndarray = h @ cell["weight_hh"].T
        if self.bias:
            products += cell["bias_hh"]
        return products

    def _run(self, cell: dict[str, np.ndarray], steps: np.ndarray, state: list[np.ndarray]
             ) -> tuple[np.ndarray, list[np.ndarray]]:
        raise NotImplementedError


@register_layer("nn.RNN")
class RNN(_Recurrent):
    """``nn.RNN``: h' = tanh (or relu) (W_ih x + b_ih + W_hh h + b_hh)."""

    nonlinearity = Param("tanh", as_str)

    def check_params(self) -> None:
        if self.nonlinearity not in ("tanh", "relu"):
            raise LayerError(f"nonlinearity must be 'tanh' or 'relu', got {self.nonlinearity!r}")

    def _run(self, cell: dict[str, np.ndarray], steps: np.ndarray, state: list[np.ndarray]
             ) -> tuple[np.ndarray, list[np.ndarray]]:
        (h,) = state
        products = self._input_products(cell, steps)
        ys = np.empty((steps.shape[0], steps.shape[1], self.hidden_size), np.float32)
        for t in range(steps.shape[0]):
            pre = products[t] + self._hidden_products(cell, h)
            h = np.tanh(pre) if self.nonlinearity == "tanh" else np.maximum(pre, 0)
            ys[t] = h
        return ys, [h]


@register_layer("nn.LSTM")
class LSTM(_Recurrent):
    """``nn.LSTM``: gates i, f, g, o; c' = f c + i g, h' = o tanh(c') (times W_hr with
    proj_size > 0, which makes h proj_size wide)."""

    GATES, STATES = 4, 2
    proj_size = Param(0, as_int)

    def check_params(self) -> None:
        if not 0 <= self.proj_size < self.hidden_size:
            raise LayerError(f"proj_size must be in [0, hidden_size), got {self.proj_size}")

    @property
    def output_size(self) -> int:
        return self.proj_size or self.hidden_size

    def _extra_weights(self, key: str) -> dict[str, tuple[int, ...]]:
        return {f"weight_hr_{key}": (self.proj_size, self.hidden_size)} if self.proj_size else {}

    def _run(self, cell: dict[str, np.ndarray], steps: np.ndarray, state: list[np.ndarray]
             ) -> tuple[np.ndarray, list[np.ndarray]]:
        h, c = state
        size = self.hidden_size
        products = self._input_products(cell, steps)
        ys = np.empty((steps.shape[0], steps.shape[1], self.output_size), np.float32)
        for t in range(steps.shape[0]):
            gates = products[t] + self._hidden_products(cell, h)
            i, f = _sigmoid(gates[:, :size]), _sigmoid(gates[:, size:2 * size])
            g, o = np.tanh(gates[:, 2 * size:3 * size]), _sigmoid(gates[:, 3 * size:])
            c = f * c + i * g
            h = o * np.tanh(c)
            if self.proj_size:
                h = h @ cell["weight_hr"].T
            ys[t] = h
        return ys, [h, c]


@register_layer("nn.GRU")
class GRU(_Recurrent):
    """``nn.GRU``: gates r, z and the candidate n, whose hidden part is scaled by r before it
    is added; h' = (1 - z) n + z h."""

    GATES = 3

    def _run(self, cell: dict[str, np.ndarray], steps: np.ndarray, state: list[np.ndarray]
             ) -> tuple[np.ndarray, list[np.ndarray]]:
        (h,) = state
        size = self.hidden_size
        products = self._input_products(cell, steps)
        ys = np.empty((steps.shape[0], steps.shape[1], size), np.float32)
        for t in range(steps.shape[0]):
            hidden = self._hidden_products(cell, h)
            r = _sigmoid(products[t][:, :size] + hidden[:, :size])
            z = _sigmoid(products[t][:, size:2 * size] + hidden[:, size:2 * size])
            n = np.tanh(products[t][:, 2 * size:] + r * hidden[:, 2 * size:])
            h = (1 - z) * n + z * h
            ys[t] = h
        return ys, [h]
