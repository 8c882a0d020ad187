"""The debugging and teaching tools of a RuntimeGraph, kept out of graph.py.

RuntimeGraph inherits these methods; each one is a door into its own module:

    g.debug(x)                  infer/debug.py     step through a forward pass
    g.add_hook(before, after)   infer/debug.py     functions around every operator
    g.verbose = True            infer/debug.py     print `type name (in shapes) -> (out shapes)`
    g.forward_all(x)            infer/debug.py     every intermediate, by operand name
    g.compare_with_torch(x)     infer/compare.py   operator by operator against PyTorch
    g.profile(x)                infer/profile.py   time, share, output size, FLOPs per operator
    g.draw()                    infer/draw.py      the graph as SVG
    g.summary()                 infer/draw.py      the graph as a table

The tool modules use only the graph's public side: ``execute`` (the loop ``forward`` drains,
infer/execution.py), ``running``, ``infer_shapes`` and the operators and operands. While a hook
is set (``add_hook`` or ``verbose``), ``forward`` runs that loop with the hooks around each
operator.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:
    from infer.compare import Comparison
    from infer.debug import Debugger, Hook, HookHandle
    from infer.draw import Drawing
    from infer.profile import Profile
    from infer.table import Table


class GraphTools:
    """Mixed into RuntimeGraph. ``_hooks`` is empty (falsy) until a hook is added."""

    _hooks: Sequence["Hook"] = ()

    # ------------------------------------------------------------------ hooks
    def add_hook(self, before=None, after=None) -> "HookHandle":
        """Call ``before(op, inputs)`` / ``after(op, inputs, outputs)`` around every operator
        of every forward pass; either may return replacement arrays. Returns a handle whose
        ``remove()`` takes the hook off again."""
        from infer.debug import Hook, HookHandle

        from parser.errors import GraphError

        if before is None and after is None:
            raise GraphError("add_hook needs a before= or an after= function")
        for key, function in (("before", before), ("after", after)):
            if function is not None and not callable(function):
                raise GraphError(f"add_hook: {key}= must be a function, got "
                                 f"{type(function).__name__}")
        hook = Hook(before, after)
        self._hook_list().append(hook)
        return HookHandle(self._hooks, hook)

    def _hook_list(self) -> list["Hook"]:
        if "_hooks" not in self.__dict__:
            self._hooks = []
        return self._hooks

    @property
    def verbose(self) -> bool | str:
        """False, or how each operator is reported: True / "print" (stdout, what a notebook
        shows) or "log" (logger ``infer.debug`` at INFO)."""
        from infer.debug import VerboseHook

        for hook in self._hooks:
            if isinstance(hook, VerboseHook):
                return hook.mode
        return False

    @verbose.setter
    def verbose(self, mode: bool | str) -> None:
        from infer.debug import VerboseHook

        if mode not in (True, False, "print", "log"):
            from parser.errors import GraphError
            raise GraphError(f"verbose takes True, False, 'print' or 'log', not {mode!r}")
        hooks = self._hook_list()
        hooks[:] = [h for h in hooks if not isinstance(h, VerboseHook)]
        if mode:
            hooks.append(VerboseHook("log" if mode == "log" else "print"))

    # ------------------------------------------------------------------ running
    def forward_all(self, *inputs: np.ndarray) -> dict[str, np.ndarray]:
        """Every operand's array by operand name: inputs, intermediates and outputs."""
        from infer.debug import forward_all

        return forward_all(self, *inputs)

    def debug(self, *inputs: np.ndarray) -> "Debugger":
        """A debug session on these inputs (see infer/debug.py)."""
        from infer.debug import Debugger

        return Debugger(self, *inputs)

    def profile(self, *inputs: np.ndarray, repeat: int = 5, warmup: int = 1,
                again: bool = False) -> "Profile":
        """Time every operator (median of ``repeat`` runs after ``warmup``); ``again``: each
        also called again at once, its code and data in cache (infer/profile.py)."""
        from infer.profile import profile

        return profile(self, *inputs, repeat=repeat, warmup=warmup, again=again)

    def compare_with_torch(self, *inputs: np.ndarray, reference: Any = None,
                           atol: float = 1e-4, rtol: float = 1e-3) -> "Comparison":
        """Run this graph and PyTorch on the same inputs and compare every operand both have.
        ``reference``: the torch module the files came from, the path of the ``*_pnnx.py``
        pnnx wrote beside them, or None for that file next to the param file."""
        from infer.compare import compare_with_torch

        return compare_with_torch(self, reference, *inputs, atol=atol, rtol=rtol)

    # ------------------------------------------------------------------ seeing
    def draw(self, *input_shapes: Sequence[int], highlight: str | None = None,
             engine: str = "auto") -> "Drawing":
        """The graph as a picture (SVG in Jupyter); shapes for ``input_shapes`` if given."""
        from infer.draw import draw_graph

        shapes = self._shapes_for(input_shapes)
        return draw_graph(self, shapes=shapes, highlight=highlight, engine=engine)

    def summary(self, *input_shapes: Sequence[int]) -> "Table":
        """One row per operator in run order: type, name, inputs, outputs with their shapes,
        parameters and weights. Shapes for ``input_shapes`` if given, else as annotated."""
        from infer.draw import summary_table

        return summary_table(self, self._shapes_for(input_shapes))

    def _shapes_for(self, input_shapes: Sequence[Sequence[int]]) -> dict | None:
        """The shape plan for one shape per graph input (None when none is given)."""
        return self.infer_shapes(*input_shapes) if input_shapes else None

    def _repr_html_(self) -> str:
        from infer.draw import graph_html

        return graph_html(self)
