""""Did you mean ...?": close names for a misspelt one, at a bounded cost.

``difflib.get_close_matches`` compares the word with every candidate, at a cost that grows
with the product of their lengths: over ten thousand long names in a hostile file it takes
tens of seconds. ``close_matches`` bounds the work whatever the input: it compares at most
``MAX_LENGTH`` characters of each name (its start and its end), and at most ``MAX_CANDIDATES``
names (of a similar length, and of those the ones sharing the longest start and end with the
word).
"""

from __future__ import annotations

import heapq
import os
from typing import Iterable

MAX_LENGTH = 80          # characters of a name that take part in the comparison
MAX_CANDIDATES = 500     # names compared at most


def _compared(name: str) -> str:
    """The part of ``name`` that is compared: all of it, or its first and last MAX_LENGTH / 2
    characters (names often differ at the end: ``blocks.11.conv.weight``)."""
    if len(name) <= MAX_LENGTH:
        return name
    half = MAX_LENGTH // 2
    return name[:half] + name[-half:]


def _shared(a: str, b: str) -> int:
    """How many characters ``a`` and ``b`` share at their start and at their end."""
    start = len(os.path.commonprefix([a, b]))
    end = len(os.path.commonprefix([a[::-1], b[::-1]]))
    return start + end


def close_matches(word: str, candidates: Iterable[str], n: int = 3,
                  cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` of ``candidates`` close to ``word`` (best first), as difflib scores them."""
    word = _compared(word)
    slack = max(len(word) // 2, 3)
    pool: dict[str, str] = {}                  # the compared part -> the candidate
    for name in candidates:
        short = _compared(name)
        if abs(len(short) - len(word)) <= slack:
            pool.setdefault(short, name)
    if len(pool) > MAX_CANDIDATES:              # those sharing the longest start and end
        keep = heapq.nlargest(MAX_CANDIDATES, pool, key=lambda short: _shared(word, short))
        pool = {short: pool[short] for short in keep}
    import difflib               # here: only an error message needs it, not a load

    return [pool[short] for short in difflib.get_close_matches(word, pool, n, cutoff)]
