"""Integers read from a file's text, within int64: the range torch's integers and pnnx's
counts and sizes have. Python's ``int()`` refuses texts of more than 4300 digits with a
ValueError of its own; ``int_in_range`` drops leading zeros and refuses long texts unread."""

from __future__ import annotations

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1


def int_in_range(text: str, low: int = INT64_MIN, high: int = INT64_MAX) -> int | None:
    """``int(text)`` of a decimal integer text (sign optional, leading zeros allowed) if it
    lies in [low, high] (at most int64's), else None."""
    negative = text.startswith("-")
    digits = text[negative:].lstrip("0") or "0"
    if len(digits) > 19:                                  # beyond int64 whatever the digits
        return None
    value = -int(digits) if negative else int(digits)
    return value if low <= value <= high else None
