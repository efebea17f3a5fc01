"""docs/benchmarks.md stays a page of current figures (the history is in git), and every link
or citation into it names a section that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
MAX_LINES = 250
LINK = re.compile(r"benchmarks\.md#([\w-]+)")
CITED = re.compile(r'benchmarks\.md, "([^"]+)"')


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors() -> set[str]:
    text = BENCHMARKS.read_text()
    headings = re.findall(r"^#+ (.+)$", text, flags=re.MULTILINE)
    return {_anchor(h) for h in headings} | set(re.findall(r'<a id="([\w-]+)"></a>', text))


def _citing_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    for folder in ("broker", "spark_jobs", "examples"):
        files += sorted((ROOT / folder).rglob("*.py")) + sorted((ROOT / folder).rglob("*.md"))
    return files


def test_benchmarks_md_is_short() -> None:
    assert len(BENCHMARKS.read_text().splitlines()) <= MAX_LINES


def test_the_anchor_of_a_heading() -> None:
    assert _anchor("Spark: the cost of acking (measured 2026-11-21 to 2026-11-26)") == (
        "spark-the-cost-of-acking-measured-2026-11-21-to-2026-11-26"
    )
    assert "acker-takeover" in _anchors()


def test_every_link_into_benchmarks_md_names_a_section() -> None:
    anchors = _anchors()
    links = [(str(p.relative_to(ROOT)), a) for p in _citing_files() for a in LINK.findall(p.read_text())]
    assert len(links) >= 3
    assert [(where, a) for where, a in links if a not in anchors] == []


def test_every_section_cited_by_name_exists() -> None:
    headings = re.findall(r"^#+ (.+)$", BENCHMARKS.read_text(), flags=re.MULTILINE)
    cited = [(str(p.relative_to(ROOT)), name) for p in _citing_files() for name in CITED.findall(p.read_text())]
    assert cited
    assert [(where, name) for where, name in cited if not any(h.startswith(name) for h in headings)] == []
