"""The helper every layer test uses: build a layer from (params, weights) as the graph does,
run it on random float32 inputs, and compare it with the torch function on the same data, on
both floors: the reference layer and, where the fast backend has one, the fast layer.

    conv, weights = torch_module(nn.Conv2d, **params)        # torch's layer and its weights
    check_layer("nn.Conv2d", conv, [(2, 3, 9, 9)], params, weights)
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import torch

import layers  # noqa: F401  (registers every layer)
import layers.fast  # noqa: F401  (registers the fast layers)
from layers import LayerRegisterer
from layers.base import Layer

_rng = np.random.default_rng(0)


def rand(*shape: int) -> np.ndarray:
    """A float32 array of standard normal values."""
    return _rng.standard_normal(shape, dtype=np.float32)


def torch_module(module_class: type[torch.nn.Module], **params: Any
                 ) -> tuple[torch.nn.Module, dict[str, np.ndarray]]:
    """The torch module built from the same params pnnx writes (they are its keyword
    arguments), in eval mode, with random weights; and those weights as numpy arrays keyed as
    pnnx keys them (``weight``, ``bias``, ``running_mean`` ...)."""
    torch.manual_seed(0)
    module = module_class(**params).eval()
    for name, buffer in module.named_buffers():
        if name == "running_var":
            buffer.uniform_(0.5, 2.0)                # variances are positive
        elif buffer.is_floating_point():
            buffer.normal_()
    weights = {key: value.detach().numpy().copy() for key, value in module.state_dict().items()
               if value.is_floating_point()}
    return module, weights


def make_layer(type_name: str, params: dict[str, Any] | None = None,
               weights: dict[str, np.ndarray] | None = None, *, fast: bool = False) -> Layer:
    """The layer registered for ``type_name`` (with ``fast``, its fast layer if it has one),
    configured as the graph does it: load_param, then load_model with read-only float32
    weights (a layer must never write into them)."""
    layer = LayerRegisterer().create(type_name, "test", fast=fast)
    layer.load_param(dict(params or {}))
    frozen = {}
    for key, value in (weights or {}).items():
        frozen[key] = np.array(value, dtype=np.float32)
        frozen[key].flags.writeable = False
    layer.load_model(frozen)
    return layer


def check_layer(type_name: str, torch_fn: Callable[..., Any],
                inputs: Sequence[tuple[int, ...] | np.ndarray],
                params: dict[str, Any] | None = None,
                weights: dict[str, np.ndarray] | None = None,
                *, atol: float = 1e-5, rtol: float = 1e-4) -> list[np.ndarray]:
    """Run the layer and ``torch_fn`` on the same inputs (a shape gives a random float32 array)
    and check that:

    * ``infer_shapes`` predicts the shapes ``forward`` returns, and both equal torch's;
    * the outputs have torch's dtypes (float32 for float32 inputs; bool, int64 ... where torch
      gives those) and are close to torch's values;
    * the inputs are left untouched;
    * an output that shares memory with an input is read-only (the graph runs in place over
      any writeable array) and its layer says so (``views_input``: the memory plan keeps the
      input's buffer while the view is read);
    * a ``support_inplace`` layer's ``forward_inplace`` gives the same values;

    for the reference layer and, if ``type_name`` has one, the fast layer (which must also
    agree with the reference). Returns the outputs of the layer a graph runs (fast if any).
    """
    arrays = [rand(*item) if isinstance(item, tuple) else np.asarray(item) for item in inputs]
    expected = torch_fn(*(torch.from_numpy(a.copy()) for a in arrays))
    if isinstance(expected, torch.Tensor):
        expected = [expected]
    expected = [e.detach().numpy() for e in expected]
    outputs = _check_floor(make_layer(type_name, params, weights), arrays, expected, atol, rtol)
    if type_name in LayerRegisterer().fast_types():
        reference = outputs
        outputs = _check_floor(make_layer(type_name, params, weights, fast=True), arrays,
                               expected, atol, rtol)
        for fast_out, ref_out in zip(outputs, reference):
            np.testing.assert_allclose(fast_out, ref_out, atol=atol, rtol=rtol,
                                       err_msg="the fast layer departs from the reference")
    return outputs


def _check_floor(layer: Layer, arrays: list[np.ndarray], expected: list[np.ndarray],
                 atol: float, rtol: float) -> list[np.ndarray]:
    """check_layer's checks for one layer (reference or fast); its outputs."""
    originals = [a.copy() for a in arrays]
    shapes = layer.infer_shapes([a.shape for a in arrays])
    layer.prepare([a.shape for a in arrays])
    outputs = layer.forward(arrays)

    assert len(outputs) == len(expected) == len(shapes)
    for out, shape, want in zip(outputs, shapes, expected):
        assert tuple(shape) == out.shape == want.shape, \
            f"infer_shapes {tuple(shape)}, forward {out.shape}, torch {want.shape}"
        assert out.dtype == want.dtype, f"output dtype {out.dtype}, torch {want.dtype}"
        np.testing.assert_allclose(out, want, atol=atol, rtol=rtol)
    for before, after in zip(originals, arrays):
        np.testing.assert_array_equal(before, after, err_msg="forward wrote into its input")
    for out in outputs:
        if any(np.shares_memory(out, a) for a in arrays):
            assert not out.flags.writeable, "an output over an input's memory is writeable"
            assert type(layer).views_input, "an output shows an input: views_input must say so"

    if layer.support_inplace:
        x = arrays[0].copy()
        layer.forward_inplace(x)
        np.testing.assert_array_equal(x, outputs[0], err_msg="forward_inplace differs")
    if layer.support_forward_into and all(a.dtype == np.float32 for a in (*arrays, *outputs)):
        into = [np.full(out.shape, np.nan, np.float32) for out in outputs]   # as the graph
        layer.forward_into(arrays, into)                                    # calls it
        for got, out in zip(into, outputs):
            np.testing.assert_allclose(got, out, atol=atol, rtol=rtol,
                                       err_msg="forward_into differs from forward")
    return outputs


def check_graph_against_torch(module: torch.nn.Module, graph: Any, *shapes: tuple[int, ...],
                              atol: float, rtol: float, seed: int = 0) -> None:
    """Run ``module`` and the built ``graph`` on the same standard normal float32 inputs of
    these shapes (drawn from ``seed``); every output must agree in count, shape and value."""
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]
    with torch.no_grad():
        want = module(*(torch.from_numpy(x.copy()) for x in xs))
    want = [want] if isinstance(want, torch.Tensor) else list(want)
    got = graph.forward(*xs)
    assert len(got) == len(want)
    for index, (g, w) in enumerate(zip(got, want)):
        assert g.shape == tuple(w.shape), f"output {index}: {g.shape} != {tuple(w.shape)}"
        np.testing.assert_allclose(g, w.numpy(), atol=atol, rtol=rtol, err_msg=f"output {index}")


def check_export(pnnx_export, module: torch.nn.Module, inputs: Sequence[np.ndarray | tuple],
                 name: str, types: Sequence[str] = (), *, atol: float = 1e-5,
                 rtol: float = 1e-4) -> list[str]:
    """Export ``module`` with pnnx (the ``pnnx_export`` fixture), run the files with
    RuntimeGraph and compare every output with torch's on the same inputs (a shape gives a
    random float32 array): values, shapes and dtypes. ``types`` are operator types the param
    file must contain (so the test checks the layer it is about, not something pnnx folded it
    into). Returns the operator types of the param file."""
    from infer import RuntimeGraph
    from parser.param import read_param

    arrays = [rand(*item) if isinstance(item, tuple) else np.asarray(item) for item in inputs]
    param, binary = pnnx_export(module.eval(), tuple(torch.from_numpy(a.copy()) for a in arrays),
                                name)
    written = [op.type for op in read_param(param).operators]
    missing = set(types) - set(written)
    assert not missing, f"pnnx wrote no {sorted(missing)}; it wrote {sorted(set(written))}"
    with torch.no_grad():
        expected = module(*(torch.from_numpy(a.copy()) for a in arrays))
    expected = list(_flatten(expected))              # the graph unpacks nested tuples in order
    outputs = RuntimeGraph(param, binary).build().forward(*arrays)
    assert len(outputs) == len(expected)
    for out, want in zip(outputs, expected):
        want = want.numpy()
        assert out.shape == want.shape and out.dtype == want.dtype, \
            f"graph gives {out.dtype}{out.shape}, torch {want.dtype}{want.shape}"
        np.testing.assert_allclose(out, want, atol=atol, rtol=rtol)
    return written


def _flatten(value):
    if isinstance(value, torch.Tensor):
        yield value
    else:
        for item in value:
            yield from _flatten(item)


# ----- nn.MultiheadAttention (tests/layers and tests/fast) -----------------------------------

def mha_layer(module: torch.nn.MultiheadAttention, input_names: Sequence[str] = (),
              num_outputs: int = 1, fast: bool = False) -> Layer:
    """The layer built from what pnnx writes for ``module``: its constructor arguments as
    parameters, its state_dict as weights (pnnx keeps the state_dict names)."""
    params = dict(embed_dim=module.embed_dim, num_heads=module.num_heads, kdim=module.kdim,
                  vdim=module.vdim, bias=module.in_proj_bias is not None,
                  batch_first=module.batch_first, add_bias_kv=module.bias_k is not None,
                  add_zero_attn=module.add_zero_attn)
    weights = {key: value.detach().numpy() for key, value in module.state_dict().items()}
    layer = make_layer("nn.MultiheadAttention", params, weights, fast=fast)
    layer.input_names, layer.num_outputs = list(input_names), num_outputs
    return layer


def randomized(module: torch.nn.Module) -> torch.nn.Module:
    """Random biases too (torch starts them at zero), so every weight matters."""
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(0, 0.5)
    return module.eval()
