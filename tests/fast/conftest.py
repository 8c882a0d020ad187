"""Fixtures of the fast kernels' tests."""

from __future__ import annotations

import pytest

from layers.fast import backend, workers


@pytest.fixture(params=[0, 1, 2], ids=["no helper", "1 helper", "2 helpers"])
def team(request):
    backend.start()
    blas = workers.find_blas()
    if blas is None:
        pytest.skip("numpy's OpenBLAS not found: no helper threads")
    team = workers.Team(request.param, blas)
    team.active.set()
    yield team
    team.stop()


@pytest.fixture
def forward_with_helpers():
    """Inside a forward of 2 threads (workers.sharing), the helpers spinning: the team."""
    backend.start()
    with workers.sharing(2):
        team = workers.current()
        if team is None:
            pytest.skip("no helper threads here")
        team.active.set()
        try:
            yield team
        finally:
            team.active.clear()


@pytest.fixture
def team_calls(monkeypatch):
    """``spy(name)``: a list that gets an item at each call of workers.Team's method
    ``name``; the machine is taken to have two usable cores, so that workers.sharing(2)
    makes a team."""
    monkeypatch.setattr(workers, "usable_cores", lambda: 2)

    def spy(name: str) -> list:
        calls: list = []
        method = getattr(workers.Team, name)
        monkeypatch.setattr(workers.Team, name,
                            lambda self, *args: calls.append(1) or method(self, *args))
        return calls
    return spy
