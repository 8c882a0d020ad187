"""layers.expression: pnnx.Expression evaluated against torch (functions, dtypes, casts,
size() and lists, shapes, a real export). The grammar: tests/parser/test_expression.py."""

import warnings

import numpy as np
import pytest
import torch

from layers.fast.layers import UFUNCS as FAST_UFUNCS, FastExpression
from layers.expression import (ExpressionLayer, affine_form, evaluate, promote_types,
                               result_dtype)
from layers.registry import LayerRegisterer
from parser.errors import ExpressionError, LayerError, ShapeError
from parser.expression import (BINARY_FUNCTIONS, CAST_FUNCTIONS, UNARY_FUNCTIONS, Constant,
                               parse_expression)
from parser.param import read_param

RNG = np.random.default_rng(0)
SHAPE, BROADCAST_SHAPE = (2, 3, 4, 5), (3, 1, 5)
TOLERANCE = dict(rtol=1e-6, atol=1e-6)



# ----- the layer against torch ------------------------------------------------------------------

def run(expr: str, *inputs):
    """The pnnx.Expression layer's single output for ``inputs``."""
    return ExpressionLayer(expr=expr).forward(list(inputs))[0]


def sample(low: float, high: float, shape=SHAPE, signed: bool = False) -> np.ndarray:
    """Uniform float32 values in [low, high); ``signed`` also flips random signs."""
    values = RNG.uniform(low, high, shape).astype(np.float32)
    return values * RNG.choice(np.float32([-1, 1]), shape) if signed else values


def check(result: np.ndarray, expected: torch.Tensor, exact: bool = False):
    """Same dtype as torch's result, same values (to 1e-6, or exactly)."""
    expected = expected.numpy()
    assert result.dtype == expected.dtype
    assert result.shape == expected.shape
    if exact:
        np.testing.assert_array_equal(result, expected)
    else:
        np.testing.assert_allclose(result, expected, **TOLERANCE)


def torch_call(function, *args):
    """Call a torch function with arrays as tensors; a Python number stays a number where torch
    takes one, else it becomes a 0-d tensor (torch.maximum(x, 2.0) needs a tensor, and
    torch.max(x, 3) would mean dim=3: pnnx's own Python writer wraps literals there too)."""
    tensors = [torch.from_numpy(a) if isinstance(a, np.ndarray) else a for a in args]
    if function not in (torch.max, torch.min):
        try:
            return function(*tensors)
        except TypeError:
            pass
    return function(*(t if torch.is_tensor(t) else torch.tensor(t) for t in tensors))


# name -> (torch function, input range, signed inputs)
UNARY = {
    "abs": (torch.abs, (-3, 3), False), "acos": (torch.acos, (-0.99, 0.99), False),
    "acosh": (torch.acosh, (1.01, 5), False), "asin": (torch.asin, (-0.99, 0.99), False),
    "asinh": (torch.asinh, (-3, 3), False), "atan": (torch.atan, (-3, 3), False),
    "atanh": (torch.atanh, (-0.99, 0.99), False), "ceil": (torch.ceil, (-3, 3), False),
    "cos": (torch.cos, (-3, 3), False), "cosh": (torch.cosh, (-3, 3), False),
    "erf": (torch.erf, (-3, 3), False), "exp": (torch.exp, (-3, 3), False),
    "expm1": (torch.expm1, (-3, 3), False), "floor": (torch.floor, (-3, 3), False),
    "log": (torch.log, (0.01, 5), False), "log10": (torch.log10, (0.01, 5), False),
    "log1p": (torch.log1p, (-0.99, 5), False), "neg": (torch.neg, (-3, 3), False),
    "reciprocal": (torch.reciprocal, (0.1, 5), True), "round": (torch.round, (-3, 3), False),
    "rsqrt": (torch.rsqrt, (0.01, 5), False), "sign": (torch.sign, (-3, 3), False),
    "sin": (torch.sin, (-3, 3), False), "sinh": (torch.sinh, (-3, 3), False),
    "sqrt": (torch.sqrt, (0, 5), False), "square": (torch.square, (-3, 3), False),
    "tan": (torch.tan, (-1.4, 1.4), False), "tanh": (torch.tanh, (-3, 3), False),
    "trunc": (torch.trunc, (-3, 3), False),
}
CASTS = {"int": int, **{name: (lambda t, d=getattr(torch, name[6:]): t.to(d))  # noqa: B008
                         for name in CAST_FUNCTIONS}}

# name -> (torch function, range of a, range of b, b signed)
BINARY = {
    "add": (torch.add, (-3, 3), (-3, 3), False), "sub": (torch.sub, (-3, 3), (-3, 3), False),
    "mul": (torch.mul, (-3, 3), (-3, 3), False), "div": (torch.div, (-3, 3), (0.5, 3), True),
    "floor_divide": (torch.floor_divide, (-9, 9), (0.5, 3), True),
    "remainder": (torch.remainder, (-9, 9), (0.5, 3), True),
    "fmod": (torch.fmod, (-9, 9), (0.5, 3), True),
    "pow": (torch.pow, (0.1, 3), (-2, 2), False),
    "max": (torch.max, (-3, 3), (-3, 3), False), "min": (torch.min, (-3, 3), (-3, 3), False),
    "maximum": (torch.maximum, (-3, 3), (-3, 3), False),
    "minimum": (torch.minimum, (-3, 3), (-3, 3), False),
    "atan2": (torch.atan2, (-3, 3), (-3, 3), False),
    "logaddexp": (torch.logaddexp, (-3, 3), (-3, 3), False),
}
BITWISE = {"and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor,
           "lshift": torch.bitwise_left_shift, "rshift": torch.bitwise_right_shift}


def test_every_function_is_tested():
    assert set(UNARY) | set(CASTS) == UNARY_FUNCTIONS
    assert set(BINARY) | set(BITWISE) | {"size"} == BINARY_FUNCTIONS


@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_matches_torch(name):
    function, (low, high), signed = UNARY[name]
    x = sample(low, high, signed=signed)
    check(run(f"{name}(@0)", x), function(torch.from_numpy(x)))


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("b_shape", [SHAPE, BROADCAST_SHAPE], ids=["same", "broadcast"])
def test_binary_matches_torch(name, b_shape):
    function, a_range, b_range, b_signed = BINARY[name]
    a, b = sample(*a_range), sample(*b_range, shape=b_shape, signed=b_signed)
    check(run(f"{name}(@0,@1)", a, b), torch_call(function, a, b))


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_with_a_python_constant_matches_torch(name):
    function, a_range, _, _ = BINARY[name]
    a, constant = sample(*a_range), -1.75 if name != "pow" else 1.5
    check(run(f"{name}(@0,{constant})", a), torch_call(function, a, constant))
    check(run(f"{name}({constant},@0)", np.abs(a) + 0.5),
          torch_call(function, torch.tensor(constant), np.abs(a) + 0.5))


@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_on_python_numbers_gives_a_python_number(name):
    _, (low, high), _, _ = BINARY[name]
    a, b = (low + high) / 2 + 0.25, 1.25
    result = evaluate(parse_expression(f"{name}({a},{b})"), [])
    expected = torch_call(BINARY[name][0], torch.tensor(a, dtype=torch.float64),
                          torch.tensor(b, dtype=torch.float64)).item()
    assert type(result) is float and result == pytest.approx(expected, rel=1e-12)


def test_round_is_half_to_even():
    x = np.float32([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 3.5])
    check(run("round(@0)", x), torch.round(torch.from_numpy(x)), exact=True)


def test_erf_is_exact_to_float32():
    x = np.linspace(-4, 4, 1001, dtype=np.float32)
    np.testing.assert_allclose(run("erf(@0)", x), torch.erf(torch.from_numpy(x)), rtol=0,
                               atol=2e-7)


# ----- dtypes -----------------------------------------------------------------------------------

DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32,
          np.float64, np.complex64, np.complex128]


def torch_dtype(dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(1, dtype)).dtype


def numpy_dtype(dtype: torch.dtype) -> np.dtype:
    """torch dtype -> numpy dtype; numpy has no complex32, the layer uses complex64 instead."""
    if dtype == torch.complex32:
        return np.dtype(np.complex64)
    return torch.empty(0, dtype=dtype).numpy().dtype


@pytest.mark.parametrize("a", DTYPES)
def test_promote_types_matches_torch(a):
    for b in DTYPES:
        expected = torch.promote_types(torch_dtype(a), torch_dtype(b))
        assert promote_types(a, b) == numpy_dtype(expected), (a, b)


@pytest.mark.parametrize("dtype", DTYPES)
def test_result_dtype_matches_torch(dtype):
    array, zero_dim = np.ones(3, dtype), np.ones((), dtype)
    tensor, zero_tensor = torch.from_numpy(array), torch.from_numpy(zero_dim)
    for number in (True, 2, 2.5, 1 + 2j):
        expected = torch.result_type(tensor, number)
        assert result_dtype([array, number]) == numpy_dtype(expected), number
    for other in DTYPES:
        other_zero = torch.ones((), dtype=torch_dtype(other))
        expected = torch.result_type(tensor, other_zero)
        assert result_dtype([array, np.ones((), other)]) == numpy_dtype(expected), other
        expected = torch.result_type(zero_tensor, other_zero)
        assert result_dtype([zero_dim, np.ones((), other)]) == numpy_dtype(expected), other


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_python_constants_keep_the_float_dtype(dtype):
    x = sample(0.5, 2).astype(dtype)
    for expr in ("mul(@0,2.0)", "add(@0,1)", "sub(1.0,@0)", "div(@0,7)", "pow(@0,2)"):
        assert run(expr, x).dtype == dtype, expr


def test_mixed_array_dtypes_follow_torch():
    ints, floats = np.arange(5), sample(0, 1, (5,))
    check(run("add(@0,@1)", ints, floats), torch.from_numpy(ints) + torch.from_numpy(floats))
    check(run("mul(@0,2.5)", ints), torch.from_numpy(ints) * 2.5)
    check(run("add(@0,@1)", ints.astype(np.int32), ints),
          torch.from_numpy(ints.astype(np.int32)) + torch.from_numpy(ints), exact=True)


INT_A = RNG.integers(-20, 20, SHAPE)
INT_B = RNG.integers(1, 6, BROADCAST_SHAPE) * RNG.choice([-1, 1], BROADCAST_SHAPE)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "floor_divide", "remainder", "fmod",
                                  "max", "min", "maximum", "minimum", "and", "or", "xor"])
def test_integer_binary_matches_torch(name):
    function = BITWISE.get(name) or BINARY[name][0]
    check(run(f"{name}(@0,@1)", INT_A, INT_B), torch_call(function, INT_A, INT_B), exact=True)
    check(run(f"{name}(@0,3)", INT_A), torch_call(function, INT_A, 3), exact=True)


@pytest.mark.parametrize("name", ["lshift", "rshift"])
def test_shifts_match_torch(name):
    shifts = np.abs(INT_B) - 1
    check(run(f"{name}(@0,@1)", INT_A, shifts), BITWISE[name](
        torch.from_numpy(INT_A), torch.from_numpy(shifts)), exact=True)


def test_sign_of_nan_is_zero_as_in_torch():
    x = np.float32([np.nan, -0.0, 0.0, -2, 3])
    check(run("sign(@0)", x), torch.sign(torch.from_numpy(x)))
    assert evaluate(parse_expression("sign(nan)"), []) == 0
    assert evaluate(parse_expression("sign(-2)"), []) == -1


def test_integer_pow_and_division():
    exponents = np.abs(INT_B) - 1
    check(run("pow(@0,@1)", INT_A, exponents),
          torch.pow(torch.from_numpy(INT_A), torch.from_numpy(exponents)), exact=True)
    check(run("div(@0,@1)", INT_A, INT_B), torch.div(torch.from_numpy(INT_A),
                                                     torch.from_numpy(INT_B)))


@pytest.mark.parametrize("name", ["abs", "neg", "sign", "square", "floor", "ceil", "round",
                                  "trunc", "sqrt", "exp"])
def test_integer_unary_matches_torch(name):
    x = np.abs(INT_A) if name == "sqrt" else INT_A
    check(run(f"{name}(@0)", x), UNARY[name][0](torch.from_numpy(x)))


@pytest.mark.parametrize("name", ["and", "or", "xor"])
def test_bool_bitwise_matches_torch(name):
    a, b = INT_A > 0, INT_B > 0
    check(run(f"{name}(@0,@1)", a, b), BITWISE[name](torch.from_numpy(a), torch.from_numpy(b)),
          exact=True)


def test_bitwise_on_floats_is_an_error():
    with pytest.raises(ExpressionError, match="integer or bool") as info:
        run("add(@0,and(@0,1))", sample(0, 1))
    assert info.value.position == 7


# ----- casts, size() and lists ------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(CAST_FUNCTIONS))
def test_casts_match_torch(name):
    x = sample(-3, 3) * 50                 # wraps around in int8 / uint8, as torch's cast does
    if name == "torch.uint8":
        x = np.abs(x)                      # negative float -> uint8 is undefined in C and numpy
    check(run(f"{name}(@0)", x), CASTS[name](torch.from_numpy(x)), exact=name != "torch.half")
    check(run(f"add({name}(@0),1)", INT_A), CASTS[name](torch.from_numpy(INT_A)) + 1,
          exact=True)


def test_cast_of_a_shape_value_matches_torch():
    x = np.zeros((2, 7, 3), np.float32)
    for name in sorted(CAST_FUNCTIONS - {"torch.bool"}):
        expected = CASTS[name](torch.tensor(7)) * 2
        check(run(f"mul({name}(size(@0,1)),2)", x), expected, exact=True)


def test_none_is_a_constant():
    """pnnx writes an absent optional argument (torch.prod's dtype) as expr=None."""
    assert parse_expression("None") == Constant(None)
    layer = ExpressionLayer(expr="None")
    assert layer.infer_shapes([]) == [()]
    (value,) = layer.forward([])
    assert value.shape == () and value.item() is None
    for expr in ["add(@0,None)", "[1,None]", "int(None)", "torch.float(None)"]:
        with pytest.raises(ExpressionError, match="None"):
            run(expr, sample(0, 1))


def test_erf_is_exact_over_the_float32_range():
    """erf is a numba ufunc over libm's erf: within 1e-6 of torch everywhere, tails included."""
    x = np.concatenate([np.linspace(-6, 6, 200001, dtype=np.float32),
                        np.float32([0.0, -0.0, 1e-30, -1e-30, 10, -10, np.inf, -np.inf])])
    np.testing.assert_allclose(run("erf(@0)", x), torch.erf(torch.from_numpy(x)).numpy(),
                               rtol=0, atol=1e-6)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(run("erf(@0)", x64), torch.erf(torch.from_numpy(x64)).numpy(),
                               rtol=0, atol=1e-12)
    assert np.isnan(run("erf(@0)", np.float32([np.nan]))[0])


def test_int_truncates_one_value():
    x = np.zeros((2, 7, 3), np.float32)
    assert evaluate(parse_expression("int(mul(size(@0,1),0.5))"), [x]) == int(7 * 0.5)
    assert evaluate(parse_expression("int(-2.7)"), []) == int(-2.7)
    with pytest.raises(ExpressionError, match="single value"):
        run("int(@0)", x)


def test_cast_output_is_never_the_input():
    x = sample(0, 1)
    result = run("torch.float(@0)", x)
    assert result is not x
    np.testing.assert_array_equal(result, x)


@pytest.mark.parametrize("dim", range(-4, 4))
def test_size(dim):
    x = np.zeros((2, 3, 5, 7), np.float32)
    assert evaluate(parse_expression(f"size(@0,{dim})"), [x]) == x.shape[dim]
    result = run(f"size(@0,{dim})", x)
    assert result.shape == () and result.dtype == np.int64 and result == x.shape[dim]


def test_size_of_the_whole_shape():
    x = np.zeros((2, 3, 5), np.float32)
    np.testing.assert_array_equal(run("size(@0)", x), np.int64([2, 3, 5]))


def test_size_in_arithmetic_matches_torch():
    x = sample(0, 1, (1, 3, 6, 10))
    t = torch.from_numpy(x)
    check(run("mul(@0,div(size(@0,2),3))", x), t * (t.size(2) / 3))
    check(run("add(mul(@0,floor_divide(size(@0,2),4)),remainder(size(@0,3),3))", x),
          t * (t.size(2) // 4) + t.size(3) % 3)
    check(run("mul(@0,div(torch.float(size(@0,2)),3.0))", x),
          t * (torch.tensor(t.size(2)).float() / 3.0))


def test_size_dim_out_of_range():
    with pytest.raises(ExpressionError, match="out of range") as info:
        run("add(@0,size(@0,4))", np.zeros((1, 2, 3, 4), np.float32))
    assert info.value.position == 7


def test_list_is_an_int64_shape():
    x = np.zeros((1, 3, 6, 10), np.float32)
    expr = "[1,mul(3,size(@0,2)),floor_divide(size(@0,3),2),-1]"
    expected = np.int64([1, 3 * x.shape[2], x.shape[3] // 2, -1])
    np.testing.assert_array_equal(run(expr, x), expected)
    assert run(expr, x).dtype == np.int64
    assert run("[]").shape == (0,)


def test_list_with_a_float_is_a_float_array():
    """Scale factors (pnnx writes [1.7,1.7] for aten::_upsample_*_aa); a shape consumer
    then refuses it by its own converter."""
    got = run("[1,mul(size(@0,1),1.5)]", np.zeros((2, 3), np.float32))
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, [1.0, 4.5])


def test_list_of_a_tensor_is_an_error():
    with pytest.raises(ExpressionError, match="single numbers") as info:
        run("[1,@0]", np.zeros((2, 3), np.float32))
    assert info.value.position == 0


def test_nested_expression_matches_torch():
    a, b, c = sample(-3, 3), sample(-3, 3, BROADCAST_SHAPE), sample(-3, 3, (5,))
    ta, tb, tc = map(torch.from_numpy, (a, b, c))
    check(run("sub(add(mul(@0,2.0),@1),@2)", a, b, c), ta * 2.0 + tb - tc)
    check(run("div(neg(@2),add(abs(@1),pow(@0,2)))", a, b, c),
          -tc / (tb.abs() + ta.pow(2)))


def test_complex_constants_match_torch():
    z = (sample(-1, 1, (4,)) + 1j * sample(-1, 1, (4,))).astype(np.complex64)
    expr = "add(mul(@0,1.500000e+00-2.000000e+00j),0.000000e+00+1.000000e+00j)"
    check(run(expr, z), torch.from_numpy(z) * (1.5 - 2j) + 1j)


# ----- shapes, errors, registration -------------------------------------------------------------

@pytest.mark.parametrize("expr, shapes, expected", [
    ("add(@0,@1)", [SHAPE, BROADCAST_SHAPE], SHAPE),
    ("mul(@0,2.0)", [SHAPE], SHAPE),
    ("neg(@1)", [SHAPE, BROADCAST_SHAPE], BROADCAST_SHAPE),
    ("size(@0,1)", [SHAPE], ()),
    ("size(@0)", [SHAPE], (4,)),
    ("[1,size(@0,2),-1]", [SHAPE], (3,)),
    ("int(mul(size(@0,1),0.5))", [SHAPE], ()),
    ("add(mul(@0,size(@1,0)),@2)", [(4, 1), (3,), (1, 6)], (4, 6)),
])
def test_infer_shapes(expr, shapes, expected):
    layer = ExpressionLayer(expr=expr)
    assert layer.infer_shapes(shapes) == [expected]
    inputs = [np.ones(s, np.float32) for s in shapes]
    assert layer.forward(inputs)[0].shape == expected


def test_infer_shapes_rejects_shapes_that_do_not_broadcast():
    with pytest.raises(ShapeError, match="broadcast"):
        ExpressionLayer(expr="add(@0,@1)").infer_shapes([(2, 3), (4,)])


@pytest.mark.parametrize("call", ["infer_shapes", "forward"])
def test_operand_beyond_the_inputs(call):
    layer = ExpressionLayer(expr="add(@0,mul(@2,2.0))")
    arguments = [SHAPE, SHAPE] if call == "infer_shapes" else [sample(0, 1), sample(0, 1)]
    with pytest.raises(ExpressionError, match="@2 needs input 2") as info:
        getattr(layer, call)(arguments)
    assert info.value.position == 11 and info.value.expression == layer.expr


def test_bad_expression_fails_at_build_time():
    with pytest.raises(ExpressionError, match="unbalanced"):
        ExpressionLayer(expr="add(@0,")
    layer = LayerRegisterer().create("pnnx.Expression", "pnnx_expr_0")
    with pytest.raises(ExpressionError, match="unknown function"):
        layer.load_param({"expr": "foo(@0)"})
    with pytest.raises(LayerError, match="string"):
        layer.load_param({"expr": 3})


def test_registered_as_pnnx_expression():
    assert LayerRegisterer().layer_class("pnnx.Expression") is ExpressionLayer
    assert ExpressionLayer.one_blob_only is False


# ----- an expression written by pnnx ------------------------------------------------------------

class Formula(torch.nn.Module):
    def forward(self, x):
        return x * (x.size(2) // 3) + torch.rsqrt(x.abs() + 1) - torch.logaddexp(x, 2 * x)


def test_real_pnnx_expression_matches_torch(tmp_path):
    pnnx = pytest.importorskip("pnnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.trace, used by pnnx
        pnnx.export(Formula(), str(tmp_path / "f.pt"), (torch.rand(1, 2, 6, 4),),
                    (torch.rand(1, 2, 9, 5),))
    graph = read_param(tmp_path / "f.pnnx.param")
    [op] = [op for op in graph.operators if op.type == "pnnx.Expression"]
    x = sample(-2, 2, (1, 2, 12, 7))  # a third size: size() is read at run time
    check(run(op.params["expr"].value, x), Formula()(torch.from_numpy(x)))


# ----- the fast floor's expression: one ufunc, into the planned buffer --------------------------

@pytest.mark.parametrize("name", sorted(FAST_UFUNCS))
@pytest.mark.parametrize("form", ["@0,@1", "@0,@0", "@1,@0", "@0,-1.75", "3,@0"])
@pytest.mark.parametrize("b_shape", [SHAPE, BROADCAST_SHAPE], ids=["same", "broadcast"])
def test_fast_expression_writes_what_the_reference_computes(name, form, b_shape):
    """FastExpression.forward_into gives the reference's float32 result bit for bit (and
    torch's), NaN and infinities included, on equal and broadcast shapes."""
    a, b = sample(-3, 3, signed=True), sample(0.5, 3, shape=b_shape, signed=True)
    a.flat[:4] = [np.nan, np.inf, -np.inf, 0.0]
    expr = f"{name}({form})"
    fast = FastExpression(expr=expr)
    assert fast.support_forward_into
    want = ExpressionLayer(expr=expr).forward([a, b])[0]
    out = np.full(want.shape, 7.0, np.float32)
    with np.errstate(all="ignore"):                # as a graph's pass runs it (running())
        fast.forward_into([a, b], [out])
    assert want.dtype == np.float32
    np.testing.assert_array_equal(out, want)
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    args = {"@0,@1": (ta, tb), "@0,@0": (ta, ta), "@1,@0": (tb, ta),
            "@0,-1.75": (ta, torch.tensor(-1.75)), "3,@0": (torch.tensor(3.0), ta)}[form]
    torch_name = {"max": "maximum", "min": "minimum", "div": "true_divide"}.get(name, name)
    np.testing.assert_allclose(out, getattr(torch, torch_name)(*args).numpy(), rtol=1e-6,
                               atol=0, equal_nan=True)


@pytest.mark.parametrize("expr", ["add(mul(@0,2),@1)", "size(@0,0)", "add(@0,True)",
                                  "pow(@0,2)", "neg(@0)", "add(2,3)", "atan2(@0,@1)"])
def test_other_expressions_evaluate_their_tree_on_the_fast_floor(expr):
    assert not FastExpression(expr=expr).support_forward_into


# ----- affine forms (what infer/fusion.py folds into a convolution) ------------------------------

@pytest.mark.parametrize("expr, form", [
    ("mul(@0,1.5)", (1.5, -0.0)), ("mul(-2,@0)", (-2.0, -0.0)), ("div(@0,4)", (0.25, -0.0)),
    ("add(@0,3)", (1.0, 3.0)), ("add(3,@0)", (1.0, 3.0)), ("sub(@0,3)", (1.0, -3.0)),
    ("sub(3,@0)", (-1.0, 3.0)), ("add(mul(0.5,@0),-0.25)", (0.5, -0.25)),
    ("add(2,mul(@0,3))", (3.0, 2.0)), ("sub(mul(@0,2),1)", (2.0, -1.0)),
    ("sub(1,div(@0,2))", (-0.5, 1.0)),
    # not one multiply then one add of numbers, with @0 alone
    ("mul(add(@0,1),2)", None), ("add(@0,mul(@0,2))", None), ("mul(@0,@1)", None),
    ("add(@1,2)", None), ("mul(@0,0)", None), ("div(@0,0)", None), ("mul(@0,inf)", None),
    ("add(@0,nan)", None), ("mul(@0,True)", None), ("mul(@0,1e39)", None),
    ("mul(@0,1e-50)", None), ("sub(add(@0,1),2)", None), ("neg(@0)", None),
    ("div(@0,0.5)", (2.0, -0.0)), ("div(@0,3)", None), ("div(@0,6)", None)])   # x/3 != x*fl(1/3)
def test_affine_form_and_torch_agree(expr, form):
    """affine_form's (a, b), computed in two rounded steps (a * x, then + b), gives the
    expression's bits, the sign of zero included."""
    assert affine_form(parse_expression(expr)) == form
    if form is None:
        return
    x = np.concatenate([RNG.standard_normal(64).astype(np.float32) * 100,
                        np.float32([0.0, -0.0, 1e-30, -7.5])])
    want = run(expr, x)
    got = np.float32(form[0]) * x + np.float32(form[1])
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))
