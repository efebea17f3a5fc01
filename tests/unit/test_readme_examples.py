"""The README's code is the examples' code: every region between ``# --8<-- [start:NAME]`` and
``# --8<-- [end:NAME]`` in ``examples/*.py`` is quoted verbatim in a README code block."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REGION = re.compile(r"^( *)# --8<-- \[start:(\w+)\]\n(.*?)^\1# --8<-- \[end:\2\]\n", re.MULTILINE | re.DOTALL)


def regions() -> list[tuple[str, str]]:
    found = []
    for path in sorted((ROOT / "examples").glob("*.py")):
        found += [(f"{path.name}:{m.group(2)}", textwrap.dedent(m.group(3)).strip())
                  for m in REGION.finditer(path.read_text())]
    return found


def test_the_examples_mark_what_the_readme_shows() -> None:
    assert {name for name, _ in regions()} >= {"quickstart.py:quickstart", "bridge_pipeline.py:bridge"}


@pytest.mark.parametrize(("name", "code"), regions())
def test_the_readme_quotes_each_region_verbatim(name: str, code: str) -> None:
    assert f"```python\n{code}\n```" in (ROOT / "README.md").read_text(), f"README does not quote {name}"
