"""Comparing with PyTorch operator by operator: a clean model agrees everywhere, and a planted
fault (a custom hardswish with its upper knee in the wrong place) is found, through pnnx's
python module and through the torch module itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from debug_models import (WrongHardswish, example_input, exported, small_net,
                          torch_outputs_by_module)
from infer import GraphError, RuntimeGraph, compare_with_torch
from infer.compare import diff_arrays, pnnx_py_path, python_name, record_pnnx_forward


@pytest.fixture
def clean(tmp_path_factory):
    return small_net(tmp_path_factory)


@pytest.fixture
def faulty(tmp_path_factory):
    return small_net(tmp_path_factory, nn__Hardswish=WrongHardswish)


def test_a_clean_model_agrees_on_every_operand_of_the_pnnx_module(clean):
    _, g = clean
    report = g.compare_with_torch(example_input())
    assert report.ok and report.first_bad is None and report.culprit is None
    produced = [o for op in g.operators if op.type not in ("pnnx.Input", "pnnx.Output")
                for o in op.outputs]
    assert [r.operand for r in report.compared] == [o.name for o in produced]
    assert report.skipped == []
    assert all(r.max_abs < 1e-4 and r.bad == 0 for r in report.compared)
    assert report.headline().startswith(f"all {len(produced)} compared operands agree")
    assert report.source == "small_net_pnnx.py"


def test_the_planted_fault_is_found_where_it_is(faulty):
    model, g = faulty
    x = example_input()
    act_in = torch_outputs_by_module(model, x)["conv2"]
    assert (act_in > 3).any() and (act_in <= 3).any()      # the fault shows above 3 only
    report = g.compare_with_torch(x)
    bad = report.first_bad
    assert not report.ok and bad.operator.name == "act" and bad.status == "BAD"
    assert report.culprit is bad                            # wrong on torch's inputs too
    torch_act = torch.nn.functional.hardswish(torch.from_numpy(act_in)).numpy()
    ours = report.ours[bad.operand]
    # where and by how much: the numbers agree with a direct comparison
    wrong = ~np.isclose(ours, torch_act, atol=report.atol, rtol=report.rtol)
    assert bad.bad == int(wrong.sum()) > 0
    assert np.all(act_in[wrong] > 3)
    assert bad.first_bad_index == tuple(int(i) for i in np.argwhere(wrong)[0])
    assert bad.ours_at == pytest.approx(float(ours[bad.first_bad_index]))
    assert bad.torch_at == pytest.approx(float(torch_act[bad.first_bad_index]), rel=1e-5)
    assert bad.max_abs == pytest.approx(float(np.abs(ours - torch_act).max()), rel=1e-4)
    assert bad.local_max_abs == pytest.approx(bad.max_abs, rel=1e-3)
    # before it all is well; after it the error is carried along, not made
    before = [r for r in report.compared if r.step < bad.step]
    after = [r for r in report.compared if r.step > bad.step]
    assert before and all(r.status == "ok" for r in before)
    assert any(r.departs for r in after)
    assert all(r.local_bad in (0, None) for r in after)
    headline = report.headline()
    assert f"step {bad.step}: nn.Hardswish act" in headline
    assert "the fault is in this operator" in headline
    assert f"{bad.bad} of 288 elements differ" in headline


def test_the_planted_fault_is_found_from_the_torch_module(faulty):
    model, g = faulty
    report = g.compare_with_torch(example_input(), reference=model)
    assert report.first_bad.operator.name == "act"
    assert report.culprit is report.first_bad
    assert report.source == "module SmallNet"
    # pnnx's own names (the conv fused with its batch norm, the expression) have no
    # torch module: skipped, not failed; the graph outputs are always compared
    skipped = {r.operator.name for r in report.skipped}
    assert {"pnnx_expr_1", "torch.flatten_0"} <= skipped
    # a fused operator (conv + relu) is compared with what its last folded operator made
    compared = {name for r in report.compared for name in [r.operator.name, *r.operator.fused]}
    assert {"relu", "pool", "conv2", "act", "avg", "fc", "head", "F.sigmoid_1"} <= compared


def test_a_clean_model_agrees_with_the_torch_module(clean):
    model, g = clean
    report = compare_with_torch(g, model, example_input(2))
    assert report.ok and len(report.compared) >= 6


def test_a_difference_that_comes_from_upstream_is_not_blamed_on_the_operator(faulty):
    _, g = faulty
    report = g.compare_with_torch(example_input())
    expr = report.row("pnnx_expr_1")                        # act + skip: carries act's error
    assert expr.departs and expr.local_bad == 0
    assert report.row(expr.operand) is expr


def test_the_table_marks_departing_rows_and_worst_lists_the_largest(faulty):
    _, g = faulty
    report = g.compare_with_torch(example_input())
    table = report.table()
    statuses = table.column("status")
    assert table.marked == {i for i, s in enumerate(statuses) if s != "ok"}
    assert statuses[table.column("name").index("act")] == "BAD"
    assert "<table>" in report._repr_html_() and "act" in str(report)
    worst = report.worst("act", k=3)
    act = report.row("act").operand
    diff = np.abs(report.ours[act].astype(np.float64) - report.torch[act])
    assert worst.column("|diff|") == pytest.approx(sorted(diff.ravel())[::-1][:3])
    assert len(report.table(all=True)) == len(report.rows)


def test_comparison_draws_departing_operators_red(faulty):
    _, g = faulty
    svg = g.compare_with_torch(example_input()).draw(engine="builtin").svg
    act = svg[svg.index('id="act"'):]
    conv2 = svg[svg.index('id="conv2"'):]
    assert "#f4a6a6" in act[:act.index("</g>")]
    assert "#c8e6c9" in conv2[:conv2.index("</g>")]
    expr = svg[svg.index('id="pnnx_expr_1"'):]                 # carries act's error only
    assert "#fdd9b5" in expr[:expr.index("</g>")]


def test_without_the_pnnx_module_the_error_says_how_to_get_one(tmp_path_factory, tmp_path):
    import shutil

    _, param, binary = exported(tmp_path_factory)
    shutil.copy(param, tmp_path / param.name)
    shutil.copy(binary, tmp_path / binary.name)
    g = RuntimeGraph(tmp_path / param.name).build()
    assert pnnx_py_path(g) == tmp_path / "small_net_pnnx.py"
    with pytest.raises(GraphError, match="--keep-extras"):
        g.compare_with_torch(example_input())


def test_a_reference_that_is_neither_a_module_nor_a_path_is_refused_before_running(clean,
                                                                                 monkeypatch):
    _, g = clean
    monkeypatch.setattr(g, "execute", lambda *a, **k: pytest.fail("ran the graph"))
    with pytest.raises(GraphError, match="reference must be the torch module.*got int"):
        g.compare_with_torch(example_input(), reference=42)


def test_the_pnnx_module_reads_the_graphs_own_weights(tmp_path_factory, tmp_path):
    """pnnx wrote the .bin path it had during export (a temporary folder, gone since) into
    the python file; the comparison reads the graph's own .bin instead: change a weight
    there and torch's side follows."""
    import shutil
    import zipfile

    _, param, binary = exported(tmp_path_factory)
    model_py = pnnx_py_path(RuntimeGraph(param, binary))
    assert "pnnx_export_" in model_py.read_text()
    shutil.copy(param, tmp_path / param.name)
    shutil.copy(model_py, tmp_path / model_py.name)
    with zipfile.ZipFile(binary) as old, zipfile.ZipFile(tmp_path / binary.name, "w") as new:
        for entry in old.namelist():
            data = old.read(entry)
            if entry == "fc.bias":
                data = (np.frombuffer(data, np.float32) + 1).astype(np.float32).tobytes()
            new.writestr(entry, data)
    changed = RuntimeGraph(tmp_path / param.name).build()
    _, original = small_net(tmp_path_factory)
    x = example_input()
    np.testing.assert_allclose(changed.forward(x)[0], original.forward(x)[0] + 1, atol=1e-5)
    report = changed.compare_with_torch(x)
    assert report.ok and report.row("fc").max_abs < 1e-4


def test_record_pnnx_forward_records_every_assigned_name():
    source = (
        "class Model:\n"
        "    def forward(self, v_0):\n"
        "        v_1 = v_0 + 1\n"
        "        v_2, v_3 = v_1, v_1 * 2\n"
        "        return v_3\n")
    seen = []
    namespace = {"__pnnx_infer_record__": lambda name, value: seen.append((name, value))}
    exec(compile(record_pnnx_forward(source), "<test>", "exec"), namespace)
    assert namespace["Model"]().forward(1) == 4
    assert seen == [("v_0", 1), ("v_1", 2), ("v_2", 2), ("v_3", 4)]
    with pytest.raises(GraphError, match="no class with a forward"):
        record_pnnx_forward("x = 1\n")


def test_python_name_follows_pnnx():
    assert python_name("12") == "v_12"
    assert python_name("x.1") == "v_x_1"
    assert python_name("a:b/c") == "v_a_b_c"


def test_diff_arrays_tolerance_nan_and_integers():
    a = np.array([1.0, 2.0, np.nan, np.nan], np.float32)
    b = np.array([1.0, 2.5, np.nan, 0.0], np.float32)
    d = diff_arrays(a, b, atol=0.1, rtol=0.0)
    assert d["bad"] == 2 and d["first_bad_index"] == (1,)
    assert d["max_abs"] == np.inf                           # NaN on one side only
    assert (d["ours_at"], d["torch_at"]) == (2.0, 2.5)
    same = diff_arrays(a[:3], b[:3] * np.array([1, 0.8, 1], np.float32), atol=0.1, rtol=0.0)
    assert same["bad"] == 0 and same["max_rel"] == 0.0      # NaN matches NaN
    ints = diff_arrays(np.array([1, 2, 3]), np.array([1, 2, 4]), atol=5, rtol=5)
    assert ints["bad"] == 1 and ints["first_bad_index"] == (2,)   # integers: exact
    assert diff_arrays(np.ones(3), 2 * np.ones(3), 0, 0)["max_rel"] == pytest.approx(0.5)


def test_a_fused_graph_is_compared_through_its_folded_operators(tmp_path_factory):
    """conv -> relu fused into one operator: it is compared with torch's relu output."""
    model, param, binary = exported(tmp_path_factory)
    g = RuntimeGraph(param, binary).build()                 # fusion on (the default)
    fused = [op for op in g.operators if op.fused]
    assert fused and all(op.output_of in op.fused for op in fused)
    report = compare_with_torch(g, model, example_input(1))
    compared = {r.operator.name for r in report.compared}
    assert report.ok and {op.name for op in fused if op.output_of in
                          dict(model.named_modules())} <= compared


def test_a_pnnx_python_module_that_is_no_python_is_a_graph_error(tmp_path):
    """Whatever pnnx writes, comparing never ends in a bare SyntaxError."""
    from infer.compare import torch_values_from_pnnx_py

    broken = tmp_path / "broken_pnnx.py"
    broken.write_text("class Model(:\n    pass\n")
    with pytest.raises(GraphError, match="not valid Python"):
        torch_values_from_pnnx_py(broken, tmp_path / "x.bin", [])


def test_a_bn_folded_model_is_compared_operator_by_operator(pnnx_export):
    """pnnx folds conv + batch norm into convbn2d_<k>, a name the torch module does not have:
    the comparison still finds torch's value of every one (the k-th conv -> bn output), also
    through an in-place ReLU that overwrites the batch norm's output."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8),
        torch.nn.Conv2d(8, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(inplace=True),
        torch.nn.Conv2d(8, 4, 1), torch.nn.BatchNorm2d(4)).eval()
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            module.running_mean.normal_()
            module.running_var.uniform_(0.5, 2.0)
    param, binary = pnnx_export(model, (torch.randn(1, 3, 8, 8),), "conv_bn")
    x = np.random.default_rng(0).standard_normal((1, 3, 8, 8), np.float32)
    for fuse in (False, True):
        graph = RuntimeGraph(param, binary, fuse=fuse).build()
        folded = [op for op in graph.operators if op.name.startswith("convbn2d_")]
        assert len(folded) == 3
        report = graph.compare_with_torch(x, reference=model)
        compared = {diff.operand for diff in report.compared}
        assert report.ok and {op.outputs[0].name for op in folded} <= compared | {
            op.outputs[0].name for op in folded if op.output_of}, report.table(all=True)
