"""Every ``docs/design.md §n`` cited in the code names a section that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CITATION = re.compile(r"docs/design\.md §(\d+)(?:-§(\d+))?")


def _sections() -> set[int]:
    text = (ROOT / "docs" / "design.md").read_text()
    return {int(n) for n in re.findall(r"^## (\d+)\.", text, flags=re.MULTILINE)}


def _citations() -> list[tuple[str, int]]:
    found = []
    for folder in ("broker", "spark_jobs", "examples", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for match in CITATION.finditer(path.read_text()):
                first, last = int(match.group(1)), int(match.group(2) or match.group(1))
                found += [(str(path.relative_to(ROOT)), n) for n in range(first, last + 1)]
    return found


def test_the_code_cites_the_design() -> None:
    assert len(_citations()) >= 10


def test_every_cited_section_exists() -> None:
    sections = _sections()
    assert sections >= set(range(1, 11))
    assert [(where, n) for where, n in _citations() if n not in sections] == []


def test_the_design_stays_short() -> None:
    """docs/design.md is the rules, at most 500 lines: measurements go to docs/benchmarks.md,
    how-tos to the README and docs/operations.md."""
    lines = (ROOT / "docs" / "design.md").read_text().splitlines()
    assert len(lines) <= 500, f"docs/design.md has {len(lines)} lines"
