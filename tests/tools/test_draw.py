"""Seeing the graph: the SVG drawing (built-in layout and Graphviz dot), the summary table,
and the HTML that a graph, an operator and an operand show in Jupyter."""

from __future__ import annotations

import re
import shutil
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from support import write_pnnx
from debug_models import INPUT_SHAPE, example_input, small_net
from infer import GraphError, RuntimeGraph
from infer.draw import DONE, HIGHLIGHT, _edges

SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture
def net(tmp_path_factory):
    return small_net(tmp_path_factory)


def boxes(svg: str) -> dict[str, dict]:
    """Operator name -> its rect's attributes and its lines of text, from a built-in SVG."""
    root = ET.fromstring(svg)
    found = {}
    for group in root.iter(f"{SVG}g"):
        if group.get("class") == "node":
            rect = group.find(f"{SVG}rect")
            found[group.get("id")] = {
                "x": float(rect.get("x")), "y": float(rect.get("y")),
                "w": float(rect.get("width")), "h": float(rect.get("height")),
                "fill": rect.get("fill"),
                "text": [t.text for t in group.iter(f"{SVG}text")]}
    return found


def test_builtin_drawing_has_a_box_per_operator_with_type_name_and_shapes(net):
    _, g = net
    drawing = g.draw(INPUT_SHAPE, engine="builtin")
    assert drawing.engine == "builtin"
    found = boxes(drawing.svg)
    assert set(found) == {op.name for op in g.operators}
    shapes = g.infer_shapes(INPUT_SHAPE)
    for op in g.operators:
        text = found[op.name]["text"]
        assert text[:2] == [op.type, op.name]
        for out in op.outputs:
            assert f"{out.name}: ({','.join(map(str, shapes[out.name]))})" in text
    paths = ET.fromstring(drawing.svg).findall(f"{SVG}path")
    assert len(paths) == len(_edges(g))


def test_builtin_layout_puts_consumers_below_producers_without_overlaps(net):
    _, g = net
    found = boxes(g.draw(engine="builtin").svg)
    for producer, consumer in _edges(g):
        p, c = found[producer.name], found[consumer.name]
        assert c["y"] >= p["y"] + p["h"], (producer.name, consumer.name)
    items = list(found.values())
    for i, a in enumerate(items):
        for b in items[i + 1:]:
            apart = (a["x"] + a["w"] <= b["x"] or b["x"] + b["w"] <= a["x"]
                     or a["y"] + a["h"] <= b["y"] or b["y"] + b["h"] <= a["y"])
            assert apart, (a["text"], b["text"])


def test_a_long_edge_gets_waypoints_beside_the_boxes(tmp_path):
    """a -> b -> c -> d and a -> d: the long edge passes the middle rows beside b and c."""
    param, _ = write_pnnx(tmp_path, """
        7767517
        6 5
        pnnx.Input in 0 1 0
        nn.ReLU a 1 1 0 1
        nn.ReLU b 1 1 1 2
        nn.ReLU c 1 1 2 3
        pnnx.Expression d 2 1 3 1 4 expr=add(@0,@1)
        pnnx.Output out 1 0 4
        """)
    g = RuntimeGraph(param).build()
    svg = g.draw(engine="builtin").svg
    found = boxes(svg)
    long_path = [p for p in ET.fromstring(svg).findall(f"{SVG}path")
                 if len(re.findall("C", p.get("d"))) == 3]          # a -> (b row) -> (c row) -> d
    assert len(long_path) == 1
    xs = [float(v) for v in re.findall(r"C[^ ]+ [^ ]+ ([\d.]+),", long_path[0].get("d"))]
    for name, x in zip(("b", "c"), xs):
        box = found[name]
        assert not box["x"] <= x <= box["x"] + box["w"], name


def test_highlight_and_done_colours(net):
    _, g = net
    found = boxes(g.draw(highlight="act", engine="builtin").svg)
    assert found["act"]["fill"] == HIGHLIGHT
    assert found["conv2"]["fill"] != HIGHLIGHT


def test_highlight_of_an_unknown_or_fused_operator(net, tmp_path_factory):
    """An unknown name is an error rather than a drawing with nothing highlighted; a name
    fusion folded away highlights the operator that absorbed it."""
    from debug_models import exported

    _, g = net
    with pytest.raises(GraphError, match=r"highlight='ac': no operator .*close: act"):
        g.draw(highlight="ac", engine="builtin")
    _, param, binary = exported(tmp_path_factory)
    fused = RuntimeGraph(param, binary).build()
    found = boxes(fused.draw(highlight="act", engine="builtin").svg)
    assert "act" not in found and found["conv2"]["fill"] == HIGHLIGHT


def test_draw_and_summary_take_one_shape_per_input(net):
    from infer import ShapeError

    _, g = net
    for shapes in ((INPUT_SHAPE, INPUT_SHAPE), (INPUT_SHAPE, (1, 3))):
        with pytest.raises(ShapeError, match="takes 1 input shape"):
            g.draw(*shapes, engine="builtin")
        with pytest.raises(ShapeError, match="takes 1 input shape"):
            g.summary(*shapes)


def test_debugger_draws_the_current_step(net):
    _, g = net
    dbg = g.debug(example_input())
    dbg.run_to("act")
    found = boxes(dbg.draw(engine="builtin").svg)
    assert found["act"]["fill"] == HIGHLIGHT
    ran = [s.operator.name for s in dbg.history[:-1]]
    assert ran and all(found[name]["fill"] == DONE for name in ran)
    assert found["fc"]["fill"] not in (DONE, HIGHLIGHT)
    assert "(1,8,6,6)" in " ".join(found["act"]["text"])       # the session's shapes


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz dot is not installed")
def test_dot_engine_draws_the_same_boxes(net):
    _, g = net
    drawing = g.draw(highlight="act", engine="dot")
    assert drawing.engine == "dot" and drawing.svg.startswith("<svg")
    root = ET.fromstring(drawing.svg)
    titles = [t.text for t in root.iter(f"{SVG}title")]
    assert sum(1 for t in titles if "->" in t) == len(_edges(g))
    texts = " ".join(t.text or "" for t in root.iter(f"{SVG}text"))
    for op in g.operators:
        assert op.name in texts
    assert HIGHLIGHT in drawing.svg
    assert g.draw().engine == "dot"                             # auto prefers dot


def test_without_dot_auto_falls_back_and_dot_is_an_error(net, monkeypatch):
    _, g = net
    monkeypatch.setattr(shutil, "which", lambda name: None)
    assert g.draw().engine == "builtin"
    with pytest.raises(GraphError, match="apt-get install graphviz"):
        g.draw(engine="dot")
    with pytest.raises(GraphError, match="engine must be"):
        g.draw(engine="neato")


def test_dot_source_and_save(net, tmp_path):
    _, g = net
    drawing = g.draw(engine="builtin")
    src = drawing.dot_source
    assert src.startswith("digraph pnnx {") and src.count(" -> ") == len(_edges(g))
    assert '"nn.Hardswish\\nact\\n5: (1,8,6,6)"' in src
    assert drawing.save(tmp_path / "g.svg").read_text() == drawing.svg
    assert drawing.save(tmp_path / "g.dot").read_text() == src
    assert drawing._repr_svg_() == drawing.svg


def test_summary_table(net):
    _, g = net
    table = g.summary()
    assert table.column("name") == [op.name for op in g.operators]
    assert table.column("type") == [op.type for op in g.operators]
    conv2 = table.records()[table.column("name").index("conv2")]
    assert conv2["outputs"] == "4 (1,8,6,6)" and conv2["inputs"] == "3"
    assert "groups=2" in conv2["params"]
    weights = sum(a.nbytes for a in g.operator("conv2").attrs.values())
    assert conv2["weights"] == f"{weights / 1024:.1f} KiB"
    bigger = g.summary((2, 3, 20, 20))
    assert bigger.records()[bigger.column("name").index("conv2")]["outputs"] == "4 (2,8,10,10)"
    assert "fused" not in table.columns
    g.operator("conv2").fused = ["bn2"]                          # as a fusing rewrite would
    assert g.summary().records()[table.column("name").index("conv2")]["fused"] == "bn2"
    assert "+ bn2" in boxes(g.draw(engine="builtin").svg)["conv2"]["text"]


def test_graph_operator_and_operand_html(net):
    _, g = net
    page = g._repr_html_()
    assert "small_net.pnnx.param" in page and "nn.Conv2d x3" in page
    assert page.count("<tr>") >= len(g.operators)
    card = g.operator("conv2")._repr_html_()
    for part in ("nn.Conv2d conv2", "groups=2", "@weight (8,4,3,3)f32", "3 (1,8,6,6)f32",
                 "&lt;- pool", "-&gt; act", "Conv2d"):
        assert part in card, part
    operand = g.operands[g.operator("act").outputs[0].name]._repr_html_()
    assert "nn.Hardswish act" in operand and "pnnx.Expression pnnx_expr_1" in operand
    assert "(1,8,6,6)" in operand


def test_html_is_escaped(tmp_path):
    param, _ = write_pnnx(tmp_path, """
        7767517
        3 2
        pnnx.Input in<put> 0 1 0
        nn.ReLU r<elu> 1 1 0 1
        pnnx.Output out 1 0 1
        """)
    g = RuntimeGraph(param).build()
    assert "r&lt;elu&gt;" in g._repr_html_() and "<elu>" not in g._repr_html_()
    assert "<elu>" not in g.operator("r<elu>")._repr_html_()
    svg = g.draw(engine="builtin").svg
    ET.fromstring(svg)                                           # well-formed
    np.testing.assert_array_equal(g.forward(-np.ones((1, 2), np.float32))[0], 0)
