"""The memory plan (infer.memory): buffers shared by liveness, in-place groups, the printed
table, and forward_into steps writing into a per-call arena: right results against torch,
views that outlive their operand, outputs the caller keeps, several threads at once."""

from __future__ import annotations

import contextlib
import threading

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from infer import Layer, LayerError, RuntimeGraph
from infer.memory import IN_PLACE, INTO, JOINED, Arena, Slot
from support import REPO, assert_plan_sound, mappings, write_pnnx


class Double(Layer):
    """y = 2 x, written into the array it is given."""

    support_forward_into = True

    def forward_one(self, x):
        return x * np.float32(2)

    def forward_into(self, inputs, outputs):
        np.multiply(inputs[0], np.float32(2), out=outputs[0])


class Add(Layer):
    """y = a + b, written into the array it is given."""

    one_blob_only = False
    support_forward_into = True

    def infer_shapes(self, shapes):
        return [tuple(np.broadcast_shapes(*shapes))]

    def forward(self, inputs):
        return [inputs[0] + inputs[1]]

    def forward_into(self, inputs, outputs):
        np.add(inputs[0], inputs[1], out=outputs[0])


class Flip(Layer):
    """y = x reversed along the last dim: a VIEW of its input (as reshapes and slices are)."""

    def forward_one(self, x):
        return x[..., ::-1]


class Broken(Double):
    def forward_into(self, inputs, outputs):
        raise ValueError("no luck")


class Triple(Layer):
    """y = 3 x, in an array of its own (no forward_into: the plan's OWN operands)."""

    def forward_one(self, x):
        return x * np.float32(3)


class ToFloat64(Layer):
    """y = x as float64 (whatever the file's annotation says)."""

    def forward_one(self, x):
        return x.astype(np.float64)


class ToFloat32(Layer):
    """y = x as float32, into a given array too (from float64 inputs the graph calls
    forward: forward_into takes float32 inputs only)."""

    support_forward_into = True

    def forward_one(self, x):
        return x.astype(np.float32)

    def forward_into(self, inputs, outputs):
        np.copyto(outputs[0], inputs[0])


CUSTOM = {"my.Double": Double, "my.Add": Add, "my.Flip": Flip, "my.Broken": Broken,
          "my.Triple": Triple, "my.ToFloat64": ToFloat64, "my.ToFloat32": ToFloat32}


def build(tmp_path, text, name="model"):
    param, binary = write_pnnx(tmp_path, text, name=name)
    graph = RuntimeGraph(param, binary)
    for type_name, layer in CUSTOM.items():
        graph.register_custom_layer(type_name, layer)
    return graph.build()


# a: input; b..f: intermediates; b is read by d2 and again by add, so it lives across c and d
DIAMOND = """
7767517
8 7
pnnx.Input   in0   0 1 a #a=(2,3,4,5)f32
my.Double    d1    1 1 a b #b=(2,3,4,5)f32
my.Double    d2    1 1 b c #c=(2,3,4,5)f32
nn.ReLU      r1    1 1 c d #d=(2,3,4,5)f32
my.Add       add   2 1 d b e #e=(2,3,4,5)f32
my.Double    d3    1 1 e f #f=(2,3,4,5)f32
my.Double    d4    1 1 f g #g=(2,3,4,5)f32
pnnx.Output  out0  1 0 g
"""


def diamond_torch(x):
    b = 2 * x
    return 4 * (F.relu(2 * b) + b)


def test_diamond_plan_reuses_buffers_by_liveness(tmp_path):
    graph = build(tmp_path, DIAMOND)
    plan = graph.memory_plan((2, 3, 4, 5))
    rows = {o.name: o for o in plan.operands}
    assert set(rows) == {"b", "c", "d", "e", "f"}     # not the input a, nor the output g
    nbytes = 2 * 3 * 4 * 5 * 4
    assert all(o.nbytes == nbytes for o in rows.values())
    assert rows["d"].buffer == rows["c"].buffer and rows["d"].how == IN_PLACE   # relu in place
    assert rows["b"].buffer != rows["c"].buffer       # b is still read when c is written
    assert rows["e"].buffer not in (rows["b"].buffer, rows["c"].buffer)   # add reads both
    assert rows["f"].buffer in (rows["b"].buffer, rows["c"].buffer)       # free again by then
    assert len(plan.buffer_sizes) == 3 and plan.arena_bytes == 3 * nbytes
    assert plan.intermediate_bytes == 5 * nbytes
    assert rows["b"].how == INTO and rows["b"].writer == "my.Double d1"
    assert (rows["b"].first, rows["b"].last) == (0, 3)
    assert (rows["c"].first, rows["c"].last) == (1, 3)   # its memory lives on as d


def test_plan_prints_as_a_table(tmp_path):
    plan = build(tmp_path, DIAMOND).memory_plan((2, 3, 4, 5))
    text = str(plan)
    header, rule, *lines = text.splitlines()
    assert header.split()[:4] == ["operand", "shape", "dtype", "bytes"]
    assert set(rule.replace(" ", "")) == {"-"}
    assert any(line.startswith("b ") and "2x3x4x5" in line and "480" in line for line in lines)
    assert "planned arena" in text and "5 intermediate operands" in text
    html = plan._repr_html_()
    assert html.count("<tr>") == 6 and "my.Double d1" in html


def test_plan_follows_the_input_shapes(tmp_path):
    graph = build(tmp_path, DIAMOND.replace("(2,3,4,5)", "(?,3,?,?)"))
    small, large = graph.memory_plan((1, 3, 2, 2)), graph.memory_plan((4, 3, 8, 8))
    assert large.arena_bytes == small.arena_bytes * 4 * 16
    assert graph.memory_plan((1, 3, 2, 2)) is small          # cached per input shapes


@pytest.mark.parametrize("shape", [(2, 3, 4, 5), (1, 3, 1, 7)])
def test_forward_into_steps_match_torch(tmp_path, shape):
    graph = build(tmp_path, DIAMOND.replace("(2,3,4,5)", "(?,3,?,?)"))
    x = np.random.default_rng(0).standard_normal(shape, dtype=np.float32)
    for _ in range(3):                                  # the arena is reused from call to call
        (got,) = graph.forward(x)
        np.testing.assert_allclose(got, diamond_torch(torch.from_numpy(x)).numpy(), rtol=1e-6)
    arena = graph.memory_plan(shape).arenas.idle[-1]
    assert arena.allocated_bytes > 0                   # the layers did write into it


SIZES = [(1, 3, 9, 11), (2, 3, 4, 5), (1, 3, 16, 16), (3, 3, 2, 7), (1, 3, 12, 4)]


def test_one_arena_serves_every_input_size(tmp_path):
    """A forward at a new input size fits the arena the last call gave back, whatever size
    that was for: the graph holds one idle arena, each buffer as large as the largest
    size needed it, and every answer is torch's."""
    graph = build(tmp_path, DIAMOND.replace("(2,3,4,5)", "(?,3,?,?)"))
    rng = np.random.default_rng(1)
    for shape in SIZES + SIZES[::-1]:
        x = rng.standard_normal(shape, dtype=np.float32)
        (got,) = graph.forward(x)
        np.testing.assert_allclose(got, diamond_torch(torch.from_numpy(x)).numpy(), rtol=1e-6)
    plans = [graph.memory_plan(shape) for shape in SIZES]
    pool = plans[0].arenas
    assert all(plan.arenas is pool for plan in plans)          # one pool for every size
    (arena,) = pool.idle
    largest = [max(sizes) for sizes in zip(*(plan.written_sizes for plan in plans))]
    assert arena.allocated_bytes == sum(size + 64 for size in largest)
    assert sum(plan.pooled_bytes for plan in plans) == arena.allocated_bytes


def test_sizes_met_again_map_no_new_buffers(tmp_path):
    """Two sizes in turn: once the arena's buffers have grown to the larger, neither size
    makes a buffer again."""
    graph = build(tmp_path, DIAMOND.replace("(2,3,4,5)", "(?,3,?,?)"))
    small = np.ones((1, 3, 4, 4), np.float32)
    large = np.ones((2, 3, 8, 8), np.float32)
    addresses = []
    for _ in range(3):
        for x in (small, large):
            (got,) = graph.forward(x)
            np.testing.assert_array_equal(got, 24 * x)          # 4 * (relu(4x) + 2x), x > 0
            (arena,) = graph.memory_plan(x.shape).arenas.idle
            addresses.append([b.ctypes.data for b in arena.buffers if b is not None])
    assert addresses[1:] == [addresses[1]] * (len(addresses) - 1)


def test_a_fitted_arena_hands_out_held_memory_to_nobody():
    """Arena.fit keeps a buffer big enough for the new sizes and lets a smaller one go; an
    array still held over either is never handed out again (its slots get fresh memory),
    and a grown buffer is new memory."""
    f32 = np.dtype(np.float32)
    arena = Arena([64])
    held = arena.array(Slot(0, (16,), f32))
    held[:] = 7.0
    arena.fit([32])                                      # smaller: the buffer stays
    other = arena.array(Slot(0, (8,), f32))
    assert not np.shares_memory(other, held)             # held: a fresh array instead
    del other
    arena.fit([256])                                     # larger: a new buffer
    grown = arena.array(Slot(0, (64,), f32))
    assert not np.shares_memory(grown, held) and (held == 7.0).all()
    assert arena.buffers[0].nbytes == 256 + 64
    assert arena.holds([256, 0]) and not arena.holds([257]) and not arena.holds([8, 8])


def test_arrays_let_go_at_the_cap_keep_held_memory_out_of_reach(monkeypatch):
    """An arena lets go of the arrays it made once MAX_ARENA_ARRAYS slots (of many sizes'
    plans) have asked; an array still held outside then still keeps its memory from being
    handed out."""
    from infer import memory

    monkeypatch.setattr(memory, "MAX_ARENA_ARRAYS", 2)
    f32 = np.dtype(np.float32)
    arena = Arena([256, 256])
    held = arena.array(Slot(0, (16,), f32))
    held[:] = 7.0
    arena.array(Slot(1, (4,), f32))                    # the cap
    again = arena.array(Slot(0, (16,), f32))           # lets go of both, makes one
    assert not np.shares_memory(again, held)
    del held
    assert np.shares_memory(arena.array(Slot(0, (16,), f32)), arena.buffers[0])


TWO_PATHS = """
7767517
8 6
pnnx.Input   in0   0 1 a #a=(?)f32
pnnx.Input   in1   0 1 b #b=(?)f32
my.Double    d1    1 1 a a1 #a1=(?)f32
my.Double    d2    1 1 a1 a2 #a2=(?)f32
my.Triple    t1    1 1 b b1 #b1=(?)f32
my.Triple    t2    1 1 b1 b2 #b2=(?)f32
pnnx.Output  out0  1 0 a2
pnnx.Output  out1  1 0 b2
"""


def test_an_idle_arena_larger_than_a_pass_writes_counts_in_the_budget(tmp_path):
    """A pass that writes little into the arena it would reuse holds all of it anyway: the
    budget counts the whole arena, and lets it go where it would take the pass over."""
    graph = build(tmp_path, TWO_PATHS)
    mib = 1 << 20
    graph.memory_budget = 6 * mib
    big, tiny = np.ones(mib // 4, np.float32), np.ones(4, np.float32)
    graph.forward(big, tiny)                           # a1 in the arena: 1 MiB
    pool = graph.memory_plan((mib // 4,), (4,)).arenas
    assert pool.idle_bytes() >= mib
    second = graph.memory_plan((4,), (mib // 4,))      # b1, its own array: 1 MiB
    needed = max(second.peak_bytes, second.arena_bytes)
    graph.memory_budget = needed + mib // 2            # room for the pass, not the arena
    assert needed + pool.idle_bytes() - sum(second.written_sizes) > graph.memory_budget
    a2, b2 = graph.forward(tiny, big)
    np.testing.assert_array_equal(a2, 4 * tiny)
    np.testing.assert_array_equal(b2, 9 * big)
    assert pool.idle_bytes() < mib                     # the 1 MiB arena was let go first


def test_a_pass_with_hooks_reuses_no_arena_and_counts_the_idle_one(tmp_path):
    """A pass that runs hooks is isolated: it makes every array anew and takes no arena, so
    the idle one counts whole beside it and goes first where both would pass the budget."""
    graph = build(tmp_path, TWO_PATHS)
    mib = 1 << 20
    big, tiny = np.ones(mib // 4, np.float32), np.ones(4, np.float32)
    graph.forward(big, tiny)                           # a1 in the arena: 1 MiB
    plan = graph.memory_plan((mib // 4,), (4,))
    assert plan.arenas.idle_bytes() >= mib
    graph.memory_budget = max(plan.peak_bytes, plan.arena_bytes) + mib // 2
    seen = []
    graph.add_hook(after=lambda op, xs, ys: seen.append(op.name))
    a2, b2 = graph.forward(big, tiny)
    np.testing.assert_array_equal(a2, 4 * big)
    assert seen and plan.arenas.idle_bytes() == 0      # let go first


CROSSED = """
7767517
6 5
pnnx.Input   in0   0 1 a #a=(?)f32
pnnx.Input   in1   0 1 b #b=(?)f32
my.Double    d1    1 1 a a1 #a1=(?)f32
my.Double    d2    1 1 b b1 #b1=(?)f32
my.Add       add   2 1 a1 b1 c #c=(?)f32
pnnx.Output  out0  1 0 c
"""


def test_an_idle_arena_whose_large_buffer_a_pass_barely_writes_counts_whole(tmp_path):
    """A pass whose large operand falls in another buffer than the one the reused arena has
    large keeps that buffer and makes another: the budget counts the arena but for what
    the pass writes into each of its buffers, and lets it go where that would pass it."""
    graph = build(tmp_path, CROSSED)
    mib = 1 << 20
    big, tiny = np.ones(mib // 4, np.float32), np.ones(1, np.float32)
    graph.forward(big, tiny)                           # a1 (1 MiB) in one buffer
    pool = graph.memory_plan((mib // 4,), (1,)).arenas
    assert mib <= pool.idle_bytes() < 2 * mib
    second = graph.memory_plan((1,), (mib // 4,))      # b1 (1 MiB) in the other
    graph.memory_budget = max(second.peak_bytes, second.arena_bytes) + mib // 2
    (got,) = graph.forward(tiny, big)
    np.testing.assert_array_equal(got, 2 * tiny + 2 * big)
    assert pool.idle_bytes() < 2 * mib                 # not both buffers of 1 MiB kept


def test_threads_at_different_sizes_each_get_an_arena(tmp_path):
    """Calls from several threads at different sizes at once: each takes an arena of its
    own from the pool (or a new one), and the pool keeps at most MAX_POOLED_ARENAS."""
    from infer.memory import MAX_POOLED_ARENAS

    graph = build(tmp_path, DIAMOND.replace("(2,3,4,5)", "(?,3,?,?)"))
    errors = []

    def worker(i):
        rng = np.random.default_rng(i)
        try:
            for j in range(30):
                x = rng.standard_normal(SIZES[(i + j) % len(SIZES)], dtype=np.float32)
                (got,) = graph.forward(x)
                np.testing.assert_allclose(got, diamond_torch(torch.from_numpy(x)).numpy(),
                                           rtol=1e-6)
        except Exception as exc:                         # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert 1 <= len(graph.memory_plan(SIZES[0]).arenas.idle) <= MAX_POOLED_ARENAS


def test_arenas_take_only_what_the_layers_write_into_them(tmp_path):
    """A buffer's planned size counts an operand that its layer allocates itself (OWN: the
    stack here, twice the size of the rest); an arena gives each buffer only what the
    forward_into layers write, since its pages are mapped in when made."""
    text = """
    7767517
    6 5
    pnnx.Input   in0   0 1 a #a=(2,3,4,5)f32
    my.Double    d1    1 1 a b #b=(2,3,4,5)f32
    torch.stack  st    2 1 b b c dim=1 #c=(2,2,3,4,5)f32
    my.Flip      f1    1 1 c d #d=(2,2,3,4,5)f32
    my.Double    d2    1 1 d e #e=(2,2,3,4,5)f32
    pnnx.Output  out0  1 0 e
    """
    graph = build(tmp_path, text)
    plan = graph.memory_plan((2, 3, 4, 5))
    rows = {o.name: o for o in plan.operands}
    assert rows["c"].how == "layer" and rows["b"].how == INTO
    assert plan.buffer_sizes[rows["c"].buffer] == rows["c"].nbytes          # planned
    assert plan.written_sizes[rows["c"].buffer] < rows["c"].nbytes          # not written
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 5), dtype=np.float32)
    for _ in range(2):
        (got,) = graph.forward(x)
        np.testing.assert_allclose(got, 4 * np.stack([x, x], axis=1)[..., ::-1])
    arena = plan.arenas.idle[-1]
    assert 0 < arena.allocated_bytes <= sum(plan.written_sizes) + 64 * len(plan.written_sizes)
    assert sum(plan.written_sizes) < plan.arena_bytes


def test_shipped_model_plan_never_overlaps_live_operands():
    """On EfficientNet-Lite0: operands sharing a buffer are never alive at once, unless one
    was written in place over the other; every buffer holds its largest operand."""
    graph = RuntimeGraph(REPO / "model_file/efficientnet_lite0/efficientnet_lite0.pnnx.param")
    plan = graph.build().memory_plan((2, 3, 224, 224))
    assert plan.arena_bytes < plan.intermediate_bytes / 3
    assert_plan_sound(plan)


FLIPPED = """
7767517
6 5
pnnx.Input   in0   0 1 a #a=(2,8)f32
my.Double    d1    1 1 a b #b=(2,8)f32
my.Flip      flip  1 1 b c #c=(2,8)f32
my.Double    d2    1 1 c d #d=(2,8)f32
my.Add       add   2 1 d c e #e=(2,8)f32
pnnx.Output  out0  1 0 e
"""


def test_a_view_that_outlives_its_operand_keeps_its_buffer(tmp_path):
    """c is a view of b: the plan frees b's buffer after flip and gives it to d, while c
    (still read by add) looks into it. The arena sees c holding the buffer and hands d a
    fresh array instead of overwriting c."""
    graph = build(tmp_path, FLIPPED)
    plan = graph.memory_plan((2, 8))
    rows = {o.name: o for o in plan.operands}
    assert rows["d"].buffer == rows["b"].buffer        # what makes the guard necessary
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    c = torch.flip(2 * torch.from_numpy(x), dims=[-1])
    for _ in range(2):
        (got,) = graph.forward(x)
        np.testing.assert_array_equal(got, (2 * c + c).numpy())


def test_a_view_layer_keeps_the_buffer_it_shows_for_its_readers(tmp_path):
    """The same graph with a registered view layer (a reshape: ``views_input``): the plan
    itself keeps b's buffer until add, the view's last reader, so d takes another one and
    the arena hands every slot its buffer (no fresh array)."""
    graph = build(tmp_path, FLIPPED.replace("my.Flip      flip  1 1 b c #c=(2,8)f32",
                                            "Tensor.reshape view 1 1 b c shape=(2,8) #c=(2,8)f32"))
    plan = graph.memory_plan((2, 8))
    rows = {o.name: o for o in plan.operands}
    assert rows["d"].buffer != rows["b"].buffer and rows["b"].last == 3      # add is step 3
    assert_plan_sound(plan)
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    for _ in range(2):
        with record_addresses(graph, "d2") as written:
            (got,) = graph.forward(x)
        np.testing.assert_array_equal(got, 3 * (2 * x))
        buffer = plan.arenas.idle[-1].buffers[rows["d"].buffer]   # d2 wrote into the arena
        assert address(buffer) <= written["d2"][1] < address(buffer) + buffer.nbytes
        del buffer                                        # (held, the arena would not lend it)


def test_an_arena_hands_out_its_memory_only_while_nobody_else_holds_it():
    """Arena.array gives each slot a view of the same memory every call (made once), and a
    fresh array whenever an array over the buffer is still held outside the arena: one it
    handed out, or a view of one; that holds for a slot asked for the first time too."""
    arena = Arena([64])
    f32 = np.dtype(np.float32)
    a, b = Slot(0, (2, 8), f32), Slot(0, (4, 4), f32)
    first = arena.array(a)
    address = first.ctypes.data
    assert address % 64 == 0 and first.flags.writeable
    del first
    again = arena.array(a)
    assert again.ctypes.data == address
    other = arena.array(b)                       # first use of b, while a's array is held
    assert not np.shares_memory(other, again)
    held = again[1:].reshape(-1)                 # a view of it, kept
    del again, other
    assert not np.shares_memory(arena.array(a), held)
    del held
    for slot in (b, a):                          # the memory is free again
        view = arena.array(slot)
        assert np.shares_memory(view, arena.buffers[0]) and view.ctypes.data == address
        del view
    assert arena.array(Slot(-1, (3,), f32)).shape == (3,)   # no buffer: a fresh array


# b is cut in two by a chunk; the cat takes both halves in order, then e (also read by d3)
# and f: every input can be written straight into its piece of g
JOINS = """
7767517
8 8
pnnx.Input   in0   0 1 a #a=(1,4,3,5)f32
my.Double    d1    1 1 a b #b=(1,4,3,5)f32
torch.chunk  ch    1 2 b c d chunks=2 dim=1 #c=(1,2,3,5)f32 #d=(1,2,3,5)f32
my.Double    d2    1 1 d e #e=(1,2,3,5)f32
my.Double    d3    1 1 e f #f=(1,2,3,5)f32
torch.cat    cat   4 1 c d e f g dim=1 #g=(1,8,3,5)f32
my.Double    d4    1 1 g h #h=(1,8,3,5)f32
pnnx.Output  out0  1 0 h
"""


def joins_torch(x):
    b = 2 * x
    c, d = torch.chunk(b, 2, dim=1)
    e = 2 * d
    return 2 * torch.cat([c, d, e, 2 * e], dim=1)


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


@contextlib.contextmanager
def record_addresses(graph, *names):
    """Where the forward_into of each named operator read its first input and wrote its
    first output, in the calls made inside: {operator name: (address, address)}."""
    written: dict[str, tuple[int, int]] = {}
    for name in names:
        layer = graph.operator(name).layer

        def recording(inputs, outputs, layer=layer, name=name):
            written[name] = (address(inputs[0]), address(outputs[0]))
            type(layer).forward_into(layer, inputs, outputs)
        layer.forward_into = recording
    try:
        yield written
    finally:
        for name in names:
            del graph.operator(name).layer.forward_into


def test_a_cat_of_batch_1_is_planned_as_its_inputs_pieces(tmp_path):
    """b (through the chunk), e and f are planned as pieces of g's buffer, at the bytes
    where the cat puts them; their producers write there and the cat copies nothing."""
    graph = build(tmp_path, JOINS.replace("(1,", "(?,"))
    plan = graph.memory_plan((1, 4, 3, 5))
    rows = {o.name: o for o in plan.operands}
    assert rows["g"].how == JOINED
    piece = 3 * 5 * 4                                   # bytes of one channel
    assert {name: (rows[name].buffer, rows[name].offset) for name in "bef"} == {
        "b": (rows["g"].buffer, 0), "e": (rows["g"].buffer, 4 * piece),
        "f": (rows["g"].buffer, 6 * piece)}
    assert rows["e"].how == INTO and "cats with inputs written in place: 1" in str(plan)
    assert f"{rows['g'].buffer}+{4 * piece:,}" in str(plan) and "into, piece of g" in str(plan)
    assert_plan_sound(plan)
    x = np.random.default_rng(3).standard_normal((1, 4, 3, 5), dtype=np.float32)
    for _ in range(3):
        with record_addresses(graph, "d1", "d2", "d3", "cat", "d4") as written:
            (got,) = graph.forward(x)
        np.testing.assert_allclose(got, joins_torch(torch.from_numpy(x)).numpy(), rtol=1e-6)
        start = written["d4"][0]                        # g, the cat's output: b, e, f lie in it
        assert (written["d1"][1], written["d2"][1], written["d3"][1]) == (
            start, start + 4 * piece, start + 6 * piece)
        assert "cat" not in written                     # with nothing to copy, never called
    (batch,) = graph.forward(np.concatenate([x, -x]))   # batch 2: pieces are not contiguous
    np.testing.assert_allclose(batch, joins_torch(torch.from_numpy(np.concatenate([x, -x])))
                               .numpy(), rtol=1e-6)
    assert JOINED not in {o.how for o in graph.memory_plan((2, 4, 3, 5)).operands}


READ_LATE = """
7767517
7 6
pnnx.Input   in0   0 1 a #a=(1,1,3,5)f32
my.Double    d1    1 1 a b #b=(1,1,3,5)f32
my.Double    d2    1 1 b c #c=(1,1,3,5)f32
torch.cat    cat   2 1 b c g dim=1 #g=(1,2,3,5)f32
my.Double    d3    1 1 g h #h=(1,2,3,5)f32
my.Add       late  2 1 h c k #k=(1,2,3,5)f32
pnnx.Output  out0  1 0 k
"""

CUT_ACROSS = """
7767517
7 7
pnnx.Input   in0   0 1 a #a=(1,4,3,5)f32
my.Double    d1    1 1 a b #b=(1,4,3,5)f32
torch.chunk  ch    1 2 b c d chunks=2 dim=3 #c=(1,4,3,3)f32 #d=(1,4,3,2)f32
my.Double    d2    1 1 d e #e=(1,4,3,2)f32
torch.cat    cat   3 1 c d e g dim=3 #g=(1,4,3,7)f32
my.Double    d3    1 1 g h #h=(1,4,3,7)f32
pnnx.Output  out0  1 0 h
"""


def test_what_a_cat_must_copy_keeps_its_own_memory(tmp_path):
    """What the cat must copy keeps memory of its own: an input read again after the cat (c,
    by late), the inputs of a cat whose output is written over in place (views of its
    pieces would see the change), the pieces of a cut along a dim whose pieces are not
    contiguous (dim 3 of a 4-channel tensor)."""
    rng = np.random.default_rng(4)
    graph = build(tmp_path / "late", READ_LATE)
    rows = {o.name: o for o in graph.memory_plan((1, 1, 3, 5)).operands}
    assert rows["b"].buffer == rows["g"].buffer and rows["c"].buffer != rows["g"].buffer
    x = rng.standard_normal((1, 1, 3, 5), dtype=np.float32)
    b = 2 * torch.from_numpy(x)
    for _ in range(2):
        (got,) = graph.forward(x)
        np.testing.assert_allclose(got, (2 * torch.cat([b, 2 * b], dim=1) + 2 * b).numpy(),
                                   rtol=1e-6)

    relu = JOINS.replace("my.Double    d4", "nn.ReLU      d4")
    graph = build(tmp_path / "relu", relu)
    assert JOINED not in {o.how for o in graph.memory_plan((1, 4, 3, 5)).operands}
    x = rng.standard_normal((1, 4, 3, 5), dtype=np.float32)
    (got,) = graph.forward(x)
    np.testing.assert_allclose(got, F.relu(joins_torch(torch.from_numpy(x)) / 2).numpy(),
                               rtol=1e-6)

    graph = build(tmp_path / "across", CUT_ACROSS)
    rows = {o.name: o for o in graph.memory_plan((1, 4, 3, 5)).operands}
    assert rows["b"].buffer != rows["g"].buffer    # its halves are not contiguous pieces
    assert JOINED not in {o.how for o in rows.values()}   # nor, with 4 channels, is e
    b = 2 * torch.from_numpy(x)
    for _ in range(2):
        (got,) = graph.forward(x)
        want = 2 * torch.cat([b[..., :3], b[..., 3:], 2 * b[..., 3:]], dim=3)
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)


SWAPPED = JOINS.replace("torch.cat    cat   4 1 c d e f g", "torch.cat    cat   4 1 d c e f g")


def test_halves_of_a_chunk_taken_out_of_order_are_copied(tmp_path):
    """cat([d, c, ...]) of c, d = chunk(b): b's halves are not where the cat wants them, so b
    is no piece (e and f still are), and the cat copies them."""
    graph = build(tmp_path, SWAPPED)
    rows = {o.name: o for o in graph.memory_plan((1, 4, 3, 5)).operands}
    assert rows["b"].piece_of == "" and rows["e"].piece_of == "g"
    x = np.random.default_rng(6).standard_normal((1, 4, 3, 5), dtype=np.float32)
    b = 2 * torch.from_numpy(x)
    c, d = b[:, :2], b[:, 2:]
    for _ in range(2):
        (got,) = graph.forward(x)
        np.testing.assert_allclose(got, 2 * torch.cat([d, c, 2 * d, 4 * d], 1).numpy(),
                                   rtol=1e-6)


# t, a graph output, is written in place over m, which takes the join's buffer once g is
# dead: a caller who keeps t holds that buffer when the next call's join begins
HELD_BY_OUTPUT = """
7767517
9 8
pnnx.Input   in0   0 1 a #a=(1,2,3,5)f32
my.Double    d1    1 1 a b #b=(1,2,3,5)f32
my.Double    d2    1 1 a c #c=(1,2,3,5)f32
torch.cat    cat   2 1 b c g dim=1 #g=(1,4,3,5)f32
my.Double    d3    1 1 g h #h=(1,4,3,5)f32
my.Double    d4    1 1 h m #m=(1,4,3,5)f32
nn.ReLU      relu  1 1 m t #t=(1,4,3,5)f32
my.Double    d5    1 1 h u #u=(1,4,3,5)f32
pnnx.Output  out0  2 0 t u
"""


def test_outputs_the_caller_keeps_are_not_overwritten_by_a_join(tmp_path):
    graph = build(tmp_path, HELD_BY_OUTPUT)
    rows = {o.name: o for o in graph.memory_plan((1, 2, 3, 5)).operands}
    assert rows["g"].how == JOINED and rows["m"].buffer == rows["g"].buffer
    rng = np.random.default_rng(7)
    kept = []
    for _ in range(3):
        x = rng.standard_normal((1, 2, 3, 5), dtype=np.float32)
        h = 4 * torch.cat([torch.from_numpy(x)] * 2, 1)
        t, u = graph.forward(x)
        kept.append((t, F.relu(2 * h).numpy()))
        np.testing.assert_allclose(u, (2 * h).numpy(), rtol=1e-6)
        for got, want in kept:
            np.testing.assert_allclose(got, want, rtol=1e-6)


# c is b itself (a shuffle by 1); the ReLU is c's only reader, so it may run in place, but
# over b, which the flatten's view e (a graph output) still shows
ALIASED = """
7767517
6 5
pnnx.Input       in0   0 1 a #a=(1,4,3,3)f32
my.Double        d1    1 1 a b #b=(1,4,3,3)f32
F.pixel_shuffle  ps    1 1 b c upscale_factor=1 #c=(1,4,3,3)f32
nn.ReLU          relu  1 1 c d #d=(1,4,3,3)f32
torch.flatten    flat  1 1 b e start_dim=1 end_dim=-1 #e=(1,36)f32
pnnx.Output      out0  2 0 d e
"""


def test_no_step_runs_in_place_over_an_array_another_operand_shows(tmp_path):
    graph = build(tmp_path, ALIASED)
    x = np.random.default_rng(8).standard_normal((1, 4, 3, 3), dtype=np.float32)
    d, e = graph.forward(x)
    np.testing.assert_array_equal(d, np.maximum(2 * x, 0))
    np.testing.assert_array_equal(e, (2 * x).reshape(1, 36))


def test_a_join_whose_buffer_is_held_outside_gives_every_piece_a_fresh_array():
    """The first piece of a join asked for in a call decides for all of them: while an array
    over the buffer is held outside, every piece and the whole are fresh arrays (the cat then
    copies them), even once the holder has let go; the next call begins again."""
    f32 = np.dtype(np.float32)
    arena = Arena([64])
    plain = Slot(0, (16,), f32)
    first, second = Slot(0, (8,), f32, 0, "g"), Slot(0, (8,), f32, 32, "g")
    whole = Slot(0, (16,), f32, 0, "g")
    held = arena.array(plain)
    arena.joins.clear()
    a = arena.array(first)
    del held
    b, g = arena.array(second), arena.array(whole)
    assert not any(np.shares_memory(v, arena.buffers[0]) for v in (a, b, g))
    del a, b, g
    arena.joins.clear()                                 # the next call
    a, b, g = arena.array(first), arena.array(second), arena.array(whole)
    assert np.shares_memory(a, g) and np.shares_memory(b, g)
    assert b.ctypes.data == a.ctypes.data + 32 and g.ctypes.data == a.ctypes.data


def test_a_stepped_pass_holding_records_still_joins_right(tmp_path):
    """The debugger and profiler hold each step's arrays one step longer: a join may find
    its buffer held and fall back to copies, never to a wrong answer. Passes that keep
    every array (hooks, forward_all, a debug session) give each step arrays of its own: the
    cat copies its inputs there."""
    graph = build(tmp_path, JOINS)
    x = np.random.default_rng(5).standard_normal((1, 4, 3, 5), dtype=np.float32)
    want = joins_torch(torch.from_numpy(x)).numpy()
    with graph.running():
        run = graph.execute(x, timed=True)
        records = list(run)
    np.testing.assert_allclose(run.outputs()[0], want, rtol=1e-6)
    assert len(records) == 6
    with graph.add_hook(after=lambda op, inputs, outputs: None):
        np.testing.assert_allclose(graph.forward(x)[0], want, rtol=1e-6)
    np.testing.assert_allclose(graph.forward_all(x)["h"], want, rtol=1e-6)
    np.testing.assert_allclose(graph.debug(x).finish()[0], want, rtol=1e-6)


def test_the_profiler_times_a_cat_it_did_not_call_as_nothing(tmp_path):
    """time_again on a joined cat's record: the loop called nothing, so nothing runs again."""
    graph = build(tmp_path, JOINS)
    x = np.random.default_rng(6).standard_normal((1, 4, 3, 5), dtype=np.float32)
    graph.forward(x)
    with graph.running():
        run = graph.execute(x, timed=True)
        again = {}
        for step, inputs, outputs, _seconds in run:
            again[step.label] = (run._call, run.time_again(step, inputs, outputs))
            del inputs, outputs                      # hold no array into the next step
    assert again["torch.cat cat"] == ("joined", 0.0)
    assert again["my.Double d4"][0] == "into" and again["my.Double d4"][1] > 0


# b's producer has a slot in g (a piece) but runs forward: its input is float64
FROM_FLOAT64 = """
7767517
7 6
pnnx.Input      in0   0 1 a #a=(1,2,3,5)f32
my.ToFloat64    f64   1 1 a p #p=(1,2,3,5)f32
my.ToFloat32    f32   1 1 p b #b=(1,2,3,5)f32
my.Double       d1    1 1 a c #c=(1,2,3,5)f32
torch.cat       cat   2 1 b c g dim=1 #g=(1,4,3,5)f32
my.Double       d2    1 1 g h #h=(1,4,3,5)f32
pnnx.Output     out0  1 0 h
"""


def test_a_cat_whose_piece_was_written_elsewhere_copies_it(tmp_path):
    """b is planned as a piece of g, but its step runs forward (a float64 input) and makes
    an array of its own: the cat is called, and copies it."""
    graph = build(tmp_path, FROM_FLOAT64)
    rows = {o.name: o for o in graph.memory_plan((1, 2, 3, 5)).operands}
    assert rows["b"].piece_of == rows["c"].piece_of == "g"
    x = np.random.default_rng(9).standard_normal((1, 2, 3, 5), dtype=np.float32)
    for _ in range(2):
        with record_addresses(graph, "cat") as written:
            (got,) = graph.forward(x)
        np.testing.assert_allclose(got, 2 * np.concatenate([x, 2 * x], 1), rtol=1e-6)
        assert "cat" in written


KEPT = """
7767517
4 3
pnnx.Input   in0   0 1 a #a=(3,4)f32
my.Double    d1    1 1 a b #b=(3,4)f32
nn.ReLU6     r1    1 1 b c #c=(3,4)f32
pnnx.Output  out0  1 0 c
"""


def test_outputs_the_caller_keeps_are_not_overwritten(tmp_path):
    """c is written in place over b, a buffer of the arena, and returned; the next call must
    not reuse that memory while the caller holds c."""
    graph = build(tmp_path, KEPT)
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((3, 4), dtype=np.float32) * 4 for _ in range(4)]
    outs = [graph.forward(x)[0] for x in xs]
    for x, out in zip(xs, outs):
        np.testing.assert_array_equal(out, F.relu6(2 * torch.from_numpy(x)).numpy())
    assert len({out.ctypes.data for out in outs}) == 4


def test_activation_forward_into_matches_torch(tmp_path):
    """b has two readers, so relu6 cannot run in place: it writes into the arena
    (the base class's forward_into: copy, then in place)."""
    text = """
    7767517
    5 4
    pnnx.Input   in0   0 1 a #a=(2,5)f32
    my.Double    d1    1 1 a b #b=(2,5)f32
    nn.ReLU6     r1    1 1 b c #c=(2,5)f32
    my.Add       add   2 1 c b d #d=(2,5)f32
    pnnx.Output  out0  1 0 d
    """
    graph = build(tmp_path, text)
    assert {o.name: o.how for o in graph.memory_plan((2, 5)).operands}["c"] == INTO
    x = np.linspace(-5, 5, 10, dtype=np.float32).reshape(2, 5)
    b = 2 * torch.from_numpy(x)
    (got,) = graph.forward(x)
    np.testing.assert_allclose(got, (F.relu6(b) + b).numpy())


def test_several_threads_share_one_graph(tmp_path):
    graph = build(tmp_path, DIAMOND.replace("(2,3,4,5)", "(?,3,?,?)"))
    rng = np.random.default_rng(2)
    inputs = [rng.standard_normal((2, 3, 16, 16), dtype=np.float32) for _ in range(8)]
    wanted = [diamond_torch(torch.from_numpy(x)).numpy() for x in inputs]
    failures = []

    def worker(index):
        for turn in range(40):
            k = (index + turn) % len(inputs)
            (got,) = graph.forward(inputs[k])
            if not np.allclose(got, wanted[k], rtol=1e-6):
                failures.append((index, turn))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures


def test_a_failing_forward_into_names_the_operator(tmp_path):
    graph = build(tmp_path, DIAMOND.replace("my.Double    d2", "my.Broken    d2"))
    with pytest.raises(LayerError, match=r"my\.Broken d2.*ValueError: no luck"):
        graph.forward(np.ones((2, 3, 4, 5), np.float32))
    (got,) = build(tmp_path, DIAMOND, "again").forward(np.ones((2, 3, 4, 5), np.float32))
    assert got.shape == (2, 3, 4, 5)                    # the arena went back to the pool


def test_an_unread_output_is_dropped_at_once(tmp_path):
    """The second half of the split is read by nobody: it is dead right after the split."""

    class Split(Layer):
        one_blob_only = False

        def infer_shapes(self, shapes):
            n, c = shapes[0]
            return [(n, c // 2), (n, c - c // 2)]

        def forward(self, inputs):
            x = inputs[0]
            return [x[:, : x.shape[1] // 2].copy(), x[:, x.shape[1] // 2:].copy()]

    text = """
    7767517
    4 4
    pnnx.Input   in0   0 1 a #a=(2,6)f32
    my.Split     s     1 2 a b c #b=(2,3)f32 #c=(2,3)f32
    my.Double    d     1 1 b e #e=(2,3)f32
    pnnx.Output  out0  1 0 e
    """
    param, binary = write_pnnx(tmp_path, text)
    graph = RuntimeGraph(param, binary)
    graph.register_custom_layer("my.Split", Split)
    graph.register_custom_layer("my.Double", Double)
    graph.build()
    rows = {o.name: o for o in graph.memory_plan((2, 6)).operands}
    assert (rows["c"].first, rows["c"].last) == (0, 0)
    x = np.arange(12, dtype=np.float32).reshape(2, 6)
    np.testing.assert_array_equal(graph.forward(x)[0], 2 * torch.from_numpy(x)[:, :3].numpy())


def _mapping_flags(address: int) -> list[str] | None:
    """The VmFlags of the mapping holding ``address`` (/proc/self/smaps), None if unknown."""
    return next((fields["VmFlags"].split() for low, high, _, fields in mappings()
                 if low <= address < high and "VmFlags" in fields), None)


def test_fresh_pages_are_writeable_and_plain():
    from parser.pages import fresh_pages

    for nbytes in (0, 1, 4096, 4 << 20, 9 << 20):
        buffer = fresh_pages(nbytes)
        assert buffer.dtype == np.uint8 and buffer.shape == (nbytes,) and buffer.flags.writeable
        buffer[:] = 7
        assert np.all(buffer == 7)
    flags = _mapping_flags(buffer.ctypes.data + buffer.nbytes // 2)   # numpy advises 2 MiB pages
    if flags is None:
        pytest.skip("no /proc/self/smaps here")
    assert "hg" not in flags          # no huge-page advice, unlike np.empty of 9 MiB


def test_fresh_pages_are_mapped_in_before_their_first_write():
    """MAP_POPULATE: the OS maps a buffer's pages in when it is made (one call), not one
    fault at a time during the first forward."""
    from parser import pages

    if not pages.POPULATE:
        pytest.skip("no MAP_POPULATE here")
    nbytes = 8 << 20
    buffer = pages.fresh_pages(nbytes)
    resident = next((int(fields["Rss"].split()[0]) << 10
                     for low, high, _, fields in mappings()
                     if low <= buffer.ctypes.data < high and "Rss" in fields), None)
    if resident is None:
        pytest.skip("no /proc/self/smaps here")
    assert resident >= nbytes


def test_arena_buffers_are_fresh_pages(tmp_path):
    """Activations of several MiB land in the arena's own pages (no huge-page advice), and
    the answer is torch's."""
    graph = build(tmp_path, DIAMOND.replace("(2,3,4,5)", "(?,3,?,?)"))
    x = np.random.default_rng(0).standard_normal((2, 3, 512, 512), dtype=np.float32)
    for _ in range(2):
        (got,) = graph.forward(x)
        np.testing.assert_allclose(got, diamond_torch(torch.from_numpy(x)).numpy(), rtol=1e-6)
    arena = graph.memory_plan(x.shape).arenas.idle[-1]
    buffers = [b for b in arena.buffers if b is not None]
    assert arena.allocated_bytes >= 6 << 20 and buffers
    flags = _mapping_flags(buffers[0].ctypes.data)
    if flags is not None:
        assert "hg" not in flags and buffers[0].ctypes.data % 4096 == 0


def test_fresh_pages_fall_back_to_numpy_when_the_os_refuses_a_mapping(monkeypatch):
    """A refused mapping (ENOMEM) is not an OSError for the user: np.empty takes over, and
    raises numpy's MemoryError if memory is really short."""
    import mmap

    from parser import pages

    def refuse(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")
    monkeypatch.setattr(mmap, "mmap", refuse)
    buffer = pages.fresh_pages(pages.HUGE_PAGE_ADVICE)
    assert buffer.shape == (pages.HUGE_PAGE_ADVICE,) and buffer.flags.writeable


_FAULTS_PER_FORWARD = """
import resource, sys
import numpy as np
from infer.memory import keep_freed_memory
if sys.argv[1] == "keep" and not keep_freed_memory():
    print("unsupported"); raise SystemExit
def forward():                                    # three outputs of a Linear, then freed
    outputs = [np.empty((197, 1536), np.float32) for _ in range(3)]   # 1.2 MB, 296 pages
    for y in outputs:
        y.fill(1.0)
for _ in range(3):
    forward()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    forward()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _faults_per_forward(mode):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items()
           if k not in ("PNNX_INFER_KEEP_FREED", "MALLOC_MMAP_THRESHOLD_",
                        "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")}
    run = subprocess.run([sys.executable, "-c", _FAULTS_PER_FORWARD, mode], env=env,
                         capture_output=True, text=True, cwd=REPO, check=True)
    return run.stdout.strip()


def test_freed_blocks_stay_mapped_for_the_next_forward():
    """keep_freed_memory (glibc's mallopt): blocks of 1.2 MB allocated again after they were
    freed reuse their pages; by default glibc trims its heap once they are freed and faults
    their pages in anew at the next allocation (888 pages a round)."""
    pytest.importorskip("resource")
    kept = _faults_per_forward("keep")
    if kept == "unsupported":
        pytest.skip("not glibc: its malloc's thresholds are not there to raise")
    default = float(_faults_per_forward("default"))
    if default < 300:
        pytest.skip(f"this C library keeps freed blocks mapped by itself ({default} faults)")
    assert float(kept) < 30


def test_freed_memory_is_left_alone_where_the_user_chose(monkeypatch):
    """PNNX_INFER_KEEP_FREED=0, or the user's own thresholds in the environment: no
    mallopt."""
    from infer.memory import keep_freed_memory

    for name, value in (("PNNX_INFER_KEEP_FREED", "0"), ("MALLOC_TRIM_THRESHOLD_", "1000"),
                        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1000")):
        with monkeypatch.context() as patch:
            patch.setenv(name, value)
            assert keep_freed_memory.__wrapped__() is False
    with monkeypatch.context() as patch:                  # another tunable is no choice of
        for name in ("PNNX_INFER_KEEP_FREED", "MALLOC_MMAP_THRESHOLD_",      # thresholds
                     "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
            patch.delenv(name, raising=False)
        plain = keep_freed_memory.__wrapped__()
        patch.setenv("GLIBC_TUNABLES", "glibc.pthread.rseq=0")
        assert keep_freed_memory.__wrapped__() is plain


def test_a_graph_build_keeps_freed_memory_mapped(tmp_path, monkeypatch):
    from infer import graph as graph_module

    calls = []
    monkeypatch.setattr(graph_module, "keep_freed_memory", lambda: calls.append(1))
    build(tmp_path, DIAMOND)
    assert calls == [1]
