""""Did you mean ...?": close names for a misspelt one, at a bounded cost.

``difflib.get_close_matches`` compares the word with every candidate, at a cost that grows
with the product of their lengths: over ten thousand long names in a hostile file it takes
tens of seconds. ``close_matches`` bounds the work whatever the input: it compares at most
``MAX_LENGTH`` characters of each name, and at most ``MAX_CANDIDATES`` names (those of a
similar length first, then those sharing the word's first characters).
"""

from __future__ import annotations

import difflib
from typing import Iterable

MAX_LENGTH = 80          # characters of a name that take part in the comparison
MAX_CANDIDATES = 500     # names compared at most


def close_matches(word: str, candidates: Iterable[str], n: int = 3,
                  cutoff: float = 0.6) -> list[str]:
    """Up to ``n`` of ``candidates`` close to ``word`` (best first), as difflib scores them."""
    word = word[:MAX_LENGTH]
    slack = max(len(word) // 2, 3)
    pool: dict[str, str] = {}                  # the compared prefix -> the candidate
    for name in candidates:
        short = name[:MAX_LENGTH]
        if abs(len(short) - len(word)) <= slack:
            pool.setdefault(short, name)
    if len(pool) > MAX_CANDIDATES:
        head = word[:3]
        sharing = [short for short in pool if short.startswith(head)]
        keep = (sharing or list(pool))[:MAX_CANDIDATES]
        pool = {short: pool[short] for short in keep}
    return [pool[short] for short in difflib.get_close_matches(word, pool, n, cutoff)]
