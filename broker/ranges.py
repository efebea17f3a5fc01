"""Sets of partition numbers as a log line shows them: runs of consecutive numbers as
``first-last`` (``0-499, 600``) with their count, not every number - at 1 000 partitions the
list of an assignment would be a line of 5 000 characters."""

from __future__ import annotations

from collections.abc import Iterable


def ranges(numbers: Iterable[int]) -> str:
    """``[0-499, 600]``: the numbers in order, each run of consecutive ones as ``first-last``."""
    runs: list[str] = []
    first = last = None
    for n in sorted(set(numbers)):
        if last is not None and n == last + 1:
            last = n
            continue
        if first is not None:
            runs.append(_run(first, last))
        first = last = n
    if first is not None:
        runs.append(_run(first, last))
    return f"[{', '.join(runs)}]"


def counted(numbers: Iterable[int]) -> str:
    """``501 [0-499, 600]``: how many, then ``ranges``."""
    unique = set(numbers)
    return f"{len(unique)} {ranges(unique)}"


def expand(text: str) -> list[int]:
    """The numbers ``ranges`` wrote (``[0-2, 5]`` -> ``[0, 1, 2, 5]``), for a reader of the logs."""
    out: list[int] = []
    for run in filter(None, (part.strip() for part in text.strip().strip("[]").split(","))):
        first, _, last = run.partition("-")
        out.extend(range(int(first), int(last or first) + 1))
    return out


def _run(first: int | None, last: int | None) -> str:
    assert first is not None and last is not None
    return str(first) if first == last else f"{first}-{last}"
