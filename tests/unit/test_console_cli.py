"""``replaybroker console``: its options, and what it refuses before serving anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker import cli


def test_without_tokens_another_bind_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("REPLAYBROKER_CONSOLE_TOKENS", raising=False)
    code = cli.main(["console", "--bootstrap", "127.0.0.1:1", "--namespace", "shop", "--bind", "0.0.0.0",
                     "--index", str(tmp_path / "i.sqlite")])
    assert code == 2
    assert "loopback only" in capsys.readouterr().err


def test_bad_tokens_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("admin=" + "x" * 20 + "\n")
    code = cli.main(["console", "--bootstrap", "127.0.0.1:1", "--namespace", "shop", "--tokens", str(tokens),
                     "--index", str(tmp_path / "i.sqlite")])
    assert code == 2
    assert "viewer=TOKEN or operator=TOKEN" in capsys.readouterr().err
    assert not (tmp_path / "i.sqlite").exists()
