"""The memory budget (infer/budget.py): a model, an input or a plan that would need more memory
than allowed is refused with a MemoryBudgetError naming the operator and the size, before
anything is allocated, whether the sizes come from parameters (upsample by 4000, arange to
1e12, padding 1e5), from the input shapes (a broadcast view, a new size at forward) or from the
peak of a plan; running out of memory for real is a MemoryBudgetError too."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from infer import GraphError, InferError, MemoryBudgetError, RuntimeGraph, ShapeError
from infer import budget
from support import REPO, expect_error, write_model

GiB = 1 << 30


def build(tmp_path, *lines, **options) -> RuntimeGraph:
    return RuntimeGraph(*write_model(tmp_path, *lines), **options).build()


# ----- sizes from parameters: refused during build, before the operator computes anything ------

# (operator line, its input shape): each asks for far more than any machine has
HUGE = {
    "upsample": ("nn.Upsample op 1 1 0 1 mode=nearest scale_factor=(4000.0,4000.0)",
                 (1, 3, 64, 64)),
    "upsample_size": ("nn.Upsample op 1 1 0 1 mode=bilinear size=(900000,900000)",
                      (1, 3, 8, 8)),
    "interpolate": ("F.interpolate op 1 1 0 1 mode=nearest scale_factor=(1e6,1e6)",
                    (1, 1, 4, 4)),
    "pad": ("F.pad op 1 1 0 1 mode=constant pad=(100000,100000,100000,100000) value=0.0",
            (1, 3, 8, 8)),
    "expand": ("Tensor.expand op 1 1 0 1 sizes=(4294967296,4294967296)", (1, 1)),
    "repeat": ("Tensor.repeat op 1 1 0 1 sizes=(100000,100000)", (2, 2)),
    "zeros": ("torch.zeros op 0 1 1 size=(100000,100000,100) dtype=torch.float", (1,)),
    "full": ("torch.full op 0 1 1 size=(1000000,1000000) fill_value=1.0 dtype=torch.float",
             (1,)),
    "arange": ("torch.arange op 0 1 1 start=0 end=1000000000000 step=1 dtype=torch.float",
               (1,)),
    "conv": ("nn.Conv2d op 1 1 0 1 in_channels=3 out_channels=2 kernel_size=(1,1) "
             "padding=(100000,100000) stride=(1,1) dilation=(1,1) groups=1 bias=False "
             "padding_mode=zeros @weight=(2,3,1,1)f32", (1, 3, 8, 8)),
    "conv_transpose": ("nn.ConvTranspose2d op 1 1 0 1 in_channels=3 out_channels=2 "
                       "kernel_size=(1,1) stride=(100000,100000) padding=(0,0) "
                       "output_padding=(0,0) dilation=(1,1) groups=1 bias=False "
                       "@weight=(3,2,1,1)f32", (1, 3, 8, 8)),
}


@pytest.mark.parametrize("reference", [False, True], ids=["fast", "reference"])
@pytest.mark.parametrize("name", HUGE)
def test_a_huge_operator_is_refused_at_build_naming_it(tmp_path, name, reference):
    line, shape = HUGE[name]
    dims = ",".join(map(str, shape))
    lines = [f"pnnx.Input in0 0 1 0 #0=({dims})f32", line]
    consumer = "1" if line.split()[2] != "0" else "1"
    lines.append(f"pnnx.Output out0 1 0 {consumer}")
    param, binary = write_model(tmp_path, *lines,
                                weights={"op.weight": np.ones((3, 2, 1, 1), np.float32)
                                         if "Transpose" in line else
                                         np.ones((2, 3, 1, 1), np.float32)})
    graph = RuntimeGraph(param, binary, reference=reference)
    error = expect_error(MemoryBudgetError, graph.build, "needs", "memory budget",
                         budget.ENV)
    assert error.operator is not None and error.operator.endswith(" op")
    assert isinstance(error, MemoryError) and isinstance(error, ShapeError)


def test_a_budget_error_leaves_the_graph_as_new(tmp_path):
    line, _ = HUGE["upsample"]
    graph = RuntimeGraph(*write_model(tmp_path, "pnnx.Input in0 0 1 0 #0=(1,3,64,64)f32", line,
                                      "pnnx.Output out0 1 0 1"))
    expect_error(MemoryBudgetError, graph.build)
    assert graph.state.name == "NEED_INIT"
    graph.memory_budget = "unlimited"           # the traced plan is only planned, not run
    graph.build()
    expect_error(MemoryBudgetError, lambda: graph.forward(np.ones((1, 3, 64, 64), np.float32))
                 if setattr(graph, "memory_budget", "1G") is None else None, "needs")


# ----- sizes from the inputs: refused at forward --------------------------------------------

DYNAMIC = ("pnnx.Input in0 0 1 0 #0=(1,3,?,?)f32",
           "nn.Upsample up 1 1 0 1 mode=nearest scale_factor=(2.0,2.0)",
           "nn.ReLU relu 1 1 1 2", "pnnx.Output out0 1 0 2")


def test_an_input_size_over_the_budget_is_refused_before_running(tmp_path):
    graph = build(tmp_path, *DYNAMIC, memory_budget="1M")
    assert graph.forward(np.ones((1, 3, 64, 64), np.float32))[0].shape == (1, 3, 128, 128)
    expect_error(MemoryBudgetError, lambda: graph.forward(np.ones((1, 3, 256, 256), np.float32)),
                 "output 1 of shape (1,3,512,512)", "3.0 MiB", "1.0 MiB")


def test_the_peak_of_a_plan_counts_every_live_operand(tmp_path):
    """x, relu(x), sigmoid(x) (1 MiB each) and their concatenation (3 MiB) are alive at once:
    every operand fits a 5.5 MiB budget, the peak of 6 MiB does not."""
    graph = build(tmp_path, "pnnx.Input in0 0 1 0 #0=(1,256,32,32)f32",
                  "nn.ReLU a 1 1 0 1", "nn.Sigmoid b 1 1 0 2",
                  "torch.cat cat 3 1 0 1 2 3 dim=1", "pnnx.Output out0 1 0 3",
                  memory_budget="7M")
    x = np.ones((1, 256, 32, 32), np.float32)
    graph.forward(x)
    assert graph.memory_plan(x.shape).peak_bytes == 6 << 20
    graph.memory_budget = "5.5M"
    expect_error(MemoryBudgetError, lambda: graph.forward(x), "a forward pass", "peak",
                 "torch.cat cat", "6.0 MiB")


def test_a_broadcast_input_is_not_copied_past_the_budget(tmp_path):
    graph = build(tmp_path, "pnnx.Input in0 0 1 0 #0=(?,?)f32", "nn.ReLU r 1 1 0 1",
                  "pnnx.Output out0 1 0 1")
    view = np.broadcast_to(np.ones(1, np.float32), (1 << 20, 1 << 18))     # 1 TiB as a copy
    error = expect_error(MemoryBudgetError, lambda: graph.forward(view), "input in0",
                         "1.0 TiB")
    assert error.operator == "pnnx.Input in0"
    cast = np.broadcast_to(np.ones(1, np.float64), (1 << 16, 1 << 16))     # 16 GiB as float32
    expect_error(MemoryBudgetError, lambda: graph.forward(cast), "input in0")


# ----- the budget itself ----------------------------------------------------------------------

@pytest.mark.parametrize("text, size", [
    ("6G", 6 * GiB), ("512M", 512 << 20), ("1.5GiB", 1.5 * GiB), ("2e9", 2e9), ("100", 100),
    (" 64 KB ", 64 << 10), ("1t", 1 << 40), ("unlimited", float("inf")), (4096, 4096)])
def test_budget_sizes(text, size):
    assert budget.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "abc", "-5G", "0", "6X", "1e999999", True, None, [1],
                                  "9" * 5000, float("nan")],
                         ids=lambda text: repr(text)[:12])
def test_bad_budget_sizes_are_graph_errors(text):
    with pytest.raises(GraphError, match="memory budget"):
        budget.parse_size(text)


def test_budget_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv(budget.ENV, "3M")
    graph = build(tmp_path, *DYNAMIC)
    assert graph.memory_budget == 3 << 20
    assert build(tmp_path / "other", *DYNAMIC, memory_budget="1G").memory_budget == GiB
    monkeypatch.setenv(budget.ENV, "lots")
    expect_error(GraphError, lambda: RuntimeGraph(*write_model(tmp_path, *DYNAMIC)),
                 budget.ENV, "lots")


def test_default_budget_is_half_of_what_the_process_may_use(monkeypatch):
    monkeypatch.delenv(budget.ENV, raising=False)
    physical = budget.os.sysconf("SC_PAGE_SIZE") * budget.os.sysconf("SC_PHYS_PAGES")
    assert budget.machine_memory() <= physical
    assert budget.default_budget() == budget.machine_memory() // 2


def test_default_budget_follows_an_address_space_limit():
    """Under ``ulimit -v`` (RLIMIT_AS) the default shrinks with it."""
    code = textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.RLIM_INFINITY))
        from infer import budget
        print(budget.default_budget())
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO, env={**budget.os.environ, budget.ENV: ""})
    assert result.returncode == 0, result.stderr
    assert int(float(result.stdout)) == 3 << 29


def test_running_out_of_memory_for_real_is_a_budget_error(tmp_path):
    """A layer whose allocation fails (an address-space limit lower than the budget) gives a
    MemoryBudgetError naming the operator, not a bare MemoryError."""
    param, binary = write_model(tmp_path, *DYNAMIC)
    code = textwrap.dedent(f"""
        import re, resource, numpy as np
        from infer import RuntimeGraph, MemoryBudgetError
        g = RuntimeGraph({str(param)!r}, {str(binary)!r}, reference=True,
                         memory_budget="unlimited").build()
        x = np.ones((1, 3, 4096, 4096), np.float32)         # 192 MiB in, 768 MiB out
        used = int(re.search(r"VmSize:\\s+(\\d+)", open("/proc/self/status").read())[1])
        resource.setrlimit(resource.RLIMIT_AS, ((used << 10) + (256 << 20), -1))
        try:
            g.forward(x)
        except MemoryBudgetError as error:
            print("refused:", error)
    """)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "refused: operator nn.Upsample up: ran out of memory" in result.stdout


def test_messages_explain_numpys_wording(tmp_path):
    """numpy's own words reach the user with what they mean for the model."""
    line = "nn.Upsample op 1 1 0 1 mode=nearest scale_factor=(inf,inf)"
    graph = RuntimeGraph(*write_model(tmp_path, "pnnx.Input in0 0 1 0 #0=(1,1,2,2)f32", line,
                                      "pnnx.Output out0 1 0 1"))
    error = expect_error(InferError, graph.build, "infinite")
    assert error.operator == "nn.Upsample op"


def test_keeping_every_operand_counts_them_all(tmp_path):
    """forward_all and the debugger keep every operand: the budget counts them all, not the
    streaming peak (30 chained ReLUs of 1 MiB: a 2 MiB peak, 31 MiB kept)."""
    lines = ["pnnx.Input in0 0 1 0 #0=(1,256,32,32)f32"]
    lines += [f"nn.Sigmoid s{i} 1 1 {i} {i + 1}" for i in range(30)]
    lines.append("pnnx.Output out0 1 0 30")
    graph = build(tmp_path, *lines, memory_budget="8M")
    x = np.ones((1, 256, 32, 32), np.float32)
    graph.forward(x)
    expect_error(MemoryBudgetError, lambda: graph.forward_all(x), "keeping every operand",
                 "31.0 MiB")


def test_arenas_kept_for_other_input_sizes_stay_within_the_budget(tmp_path):
    """The graph keeps an idle arena for the next call, fitted to each new size; over many
    sizes the arenas are let go before they would take the graph past its budget."""
    graph = build(tmp_path, "pnnx.Input in0 0 1 0 #0=(1,?,32,32)f32", "nn.ReLU r 1 1 0 1",
                  "nn.Sigmoid s 1 1 1 2", "pnnx.Output out0 1 0 2", memory_budget="6M")
    for channels in range(200, 260, 5):                 # 12 sizes of about 1 MiB
        x = np.ones((1, channels, 32, 32), np.float32)
        graph.forward(x)
        plans = [graph.memory_plan(*[(1, c, 32, 32)]) for c in range(200, channels + 1, 5)]
        assert sum(plan.pooled_bytes for plan in plans) <= 6 << 20
