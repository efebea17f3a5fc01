"""``replaybroker task --handler MODULE:FUNCTION``: how the handler is found, and the one-line
errors when it is not (no Kafka needed: the handler is loaded before anything connects)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from broker import cli
from broker.errors import ConfigurationError


def test_the_handler_is_imported_from_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "rb_cli_handlers.py").write_text("def enrich(record, ctx):\n    return None\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    handler = cli.load_handler("rb_cli_handlers:enrich")
    assert callable(handler) and handler.__name__ == "enrich"


@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ("rb_cli_handlers", "expected MODULE:FUNCTION"),
        (":enrich", "expected MODULE:FUNCTION"),
        ("no_such_module_here:enrich", "cannot import no_such_module_here"),
        ("json:no_such_function", "json has no function no_such_function"),
        ("json:__doc__", "json has no function __doc__"),  # there, but not callable
    ],
)
def test_a_handler_that_cannot_be_had_is_a_clear_error(spec: str, why: str) -> None:
    with pytest.raises(ConfigurationError, match=why):
        cli.load_handler(spec)


def test_the_command_says_so_in_one_line_and_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["task", "--bootstrap", "127.0.0.1:1", "--namespace", "ns", "--handler", "nope",
                     "--topics", "t", "--group", "g"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err == ["replaybroker: --handler 'nope': expected MODULE:FUNCTION, e.g. myjob.handlers:enrich"]
