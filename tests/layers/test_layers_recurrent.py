"""nn.RNN / nn.LSTM / nn.GRU against torch: through pnnx exports, and built by hand from a
torch module's weights (unbatched input, proj_size, initial states, bad shapes)."""

import numpy as np
import pytest
import torch
from torch import nn

from helpers import check_export, make_layer, rand
from parser.errors import LayerError, ShapeError


class Sequences(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True, bidirectional=True)
        self.gru = nn.GRU(8, 12, num_layers=2)
        self.rnn = nn.RNN(8, 6, nonlinearity="relu", bias=False, bidirectional=True)

    def forward(self, x, h0, c0):
        a, (hn, cn) = self.lstm(x, (h0, c0))
        b, hg = self.gru(x.transpose(0, 1))
        c, _ = self.rnn(x.transpose(0, 1))               # h_n unused: pnnx drops it
        return a, hn, cn, b, hg, c


def test_pnnx_export_of_lstm_gru_and_rnn_matches_torch(pnnx_export):
    """Two-layer bidirectional batch-first LSTM with initial states, two-layer GRU without,
    bidirectional ReLU RNN without bias."""
    torch.manual_seed(0)
    check_export(pnnx_export, Sequences(), [(2, 5, 8), (4, 2, 16), (4, 2, 16)], "sequences",
                 ["nn.LSTM", "nn.GRU", "nn.RNN"])


def layer_from(module: nn.Module, type_name: str):
    params = {name: getattr(module, name) for name in
              ("input_size", "hidden_size", "num_layers", "bias", "batch_first",
               "bidirectional")}
    if isinstance(module, nn.LSTM):
        params["proj_size"] = module.proj_size
    if isinstance(module, nn.RNN):
        params["nonlinearity"] = module.nonlinearity
    weights = {name: value.detach().numpy() for name, value in module.named_parameters()}
    return make_layer(type_name, params, weights)


CASES = {
    "lstm proj_size": (lambda: nn.LSTM(5, 7, num_layers=2, proj_size=3), "nn.LSTM"),
    "gru bidirectional batch first": (lambda: nn.GRU(5, 4, batch_first=True,
                                                     bidirectional=True), "nn.GRU"),
    "rnn tanh": (lambda: nn.RNN(5, 3, num_layers=3), "nn.RNN"),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("batched", [True, False], ids=["batched", "unbatched"])
def test_built_by_hand_from_torch_weights(case, batched):
    torch.manual_seed(1)
    make_module, type_name = case
    module = make_module().eval()
    layer = layer_from(module, type_name)
    x = rand(6, 2, 5) if batched else rand(6, 5)
    if batched and module.batch_first:
        x = np.ascontiguousarray(x.transpose(1, 0, 2))
    with torch.no_grad():
        out, state = module(torch.from_numpy(x))
    states = state if isinstance(state, tuple) else (state,)
    got = layer.forward([x])
    assert [g.shape for g in got] == [out.shape] + [s.shape for s in states]
    assert layer.infer_shapes([x.shape]) == [g.shape for g in got]
    for g, want in zip(got, (out, *states)):
        np.testing.assert_allclose(g, want.numpy(), atol=1e-6)


def test_initial_states_are_used_and_checked():
    torch.manual_seed(2)
    module = nn.LSTM(4, 3, num_layers=2).eval()
    layer = layer_from(module, "nn.LSTM")
    x, h0, c0 = rand(5, 2, 4), rand(2, 2, 3), rand(2, 2, 3)
    with torch.no_grad():
        out, (hn, cn) = module(*(torch.from_numpy(a) for a in (x,)), (torch.from_numpy(h0),
                                                                      torch.from_numpy(c0)))
    got = layer.forward([x, h0, c0])
    for g, want in zip(got, (out, hn, cn)):
        np.testing.assert_allclose(g, want.numpy(), atol=1e-6)
    with pytest.raises(ShapeError, match="initial state 1 has shape"):
        layer.infer_shapes([x.shape, (1, 2, 3), c0.shape])
    with pytest.raises(ShapeError, match=r"expects \(L, N, 4\)"):
        layer.infer_shapes([(5, 2, 7)])


def test_missing_or_misshapen_weights_are_refused():
    params = {"input_size": 4, "hidden_size": 3}
    with pytest.raises(LayerError, match="missing weight @weight_hh_l0"):
        make_layer("nn.GRU", params, {"weight_ih_l0": np.zeros((9, 4))})
    with pytest.raises(LayerError, match=r"@weight_ih_l0 has shape \(8, 4\), expected \(9, 4\)"):
        make_layer("nn.GRU", {**params, "bias": False},
                   {"weight_ih_l0": np.zeros((8, 4)), "weight_hh_l0": np.zeros((9, 3))})
    with pytest.raises(LayerError, match="nonlinearity"):
        make_layer("nn.RNN", {**params, "nonlinearity": "gelu"})
