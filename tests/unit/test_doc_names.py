"""The project's own names that README.md and docs/*.md use exist, so a rename cannot leave
the docs behind:

- settings and attributes of the project's classes, as the docs write them in backticks:
  ``SourceConfig(max_pending=...)``, ``AckerConfig.unlogged_ms``, ``Source.send_many``,
  ``ctx.touch()`` (``ctx``, ``record``, ``source``, ``app``: the names the examples give a
  ``TaskContext``, ``TaskRecord``, ``Source``, ``App``);
- modules and what they hold: ``broker.kafka_io``, ``spark_jobs.measure.compare_acking``,
  ``topics.check`` (a module of ``broker`` or ``spark_jobs`` by its last name);
- files of the repository: ``broker/acker/lag.py``, ``test_chaos.py::test_...``;
- commands: ``replaybroker dlq redrive --reason-prefix ...``, in backticks and in code blocks,
  checked against ``broker.cli.build_parser()`` - each subcommand and each flag.

Only the forms above are read; a name the docs use in another form, or a name of Kafka's,
Spark's or Python's own, is not checked.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import pkgutil
import re
import shlex
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

import broker
import spark_jobs
from broker.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PACKAGES = (broker, spark_jobs)
# What the docs and examples call an instance of a class.
ALIASES = {"ctx": "TaskContext", "record": "TaskRecord", "source": "Source", "app": "App"}

SPAN = re.compile(r"`([^`\n]+)`")
FENCE = re.compile(r"^```.*?$(.*?)^```", re.M | re.S)
# Class(kw=..., kw2=...), Class.attr, alias.attr - a CamelCase class of the project.
CALL = re.compile(r"\b([A-Z][A-Za-z0-9]*)\(((?:[^()]|\([^()]*\))*)\)")  # one level of nested calls
ATTR = re.compile(r"(?<![\w.])([A-Za-z_][A-Za-z0-9_]*)\.([a-z_][A-Za-z0-9_]*)(\*?)")
DOTTED = re.compile(r"(?<![\w./-])((?:broker|spark_jobs)(?:\.[A-Za-z_][A-Za-z0-9_]*)+)")
MODULE_ATTR = re.compile(r"(?<![\w./-])([a-z_][a-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*)\b")
PATH = re.compile(r"^((?:broker|spark_jobs|tests|docs|docker|examples|schemas)/[\w./*-]+)$")
TEST = re.compile(r"^(test_\w+\.py)(?:::(\w+))?$")
FILE = re.compile(r"^(\w+\.py)$")  # the project's, or a user's (``shop_tasks.py``): not checked
# Modules whose last name the docs use for something else: benchmark figures (``spark.*``,
# ``keys.zipf*``, ``cost.*``) and the example's topic (``orders.replay``).
NOT_MODULES = ("broker.bench.", "spark_jobs.orders")
KEYWORD = re.compile(r"\b([a-z_][a-z0-9_]*)\s*=(?!=)")


@dataclasses.dataclass(frozen=True)
class Use:
    """A name as a doc uses it: where, and the text it was found in."""

    where: str
    text: str


def _spans() -> Iterator[Use]:
    for doc in DOCS:
        text = doc.read_text()
        for n, line in enumerate(text.splitlines(), 1):
            for span in SPAN.findall(line):
                yield Use(f"{doc.name}:{n}", span)


def _command_lines() -> Iterator[Use]:
    """``replaybroker ...`` in backticks, and the lines of code blocks that run it."""
    for use in _spans():
        if use.text.startswith("replaybroker "):
            yield use
    for doc in DOCS:
        text = doc.read_text()
        for block in FENCE.finditer(text):
            first = text.count("\n", 0, block.start(1)) + 1
            lines = block.group(1).splitlines()
            joined: list[tuple[int, str]] = []
            for i, line in enumerate(lines):  # continuation lines (a trailing backslash)
                if joined and joined[-1][1].endswith("\\"):
                    joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
                else:
                    joined.append((first + i, line.strip()))
            for n, line in joined:
                line = line.removeprefix("$ ")
                if line.startswith("replaybroker "):
                    yield Use(f"{doc.name}:{n}", line)


@cache
def _project_modules() -> list[Any]:
    """Every module of ``broker`` and ``spark_jobs`` (not ``__main__``: it runs the CLI)."""
    return [
        importlib.import_module(info.name)
        for package in PACKAGES
        for info in pkgutil.walk_packages(package.__path__, package.__name__ + ".")
        if not info.name.endswith(".__main__")
    ]


@cache
def _classes() -> dict[str, type]:
    """Every class of the project by its name (one defined in its module, not imported)."""
    found: dict[str, type] = {}
    for module in _project_modules():
        for name, value in vars(module).items():
            if inspect.isclass(value) and value.__module__ == module.__name__:
                found.setdefault(name, value)
    return found


@cache
def _modules() -> dict[str, Any]:
    """The project's modules by their last name (``topics`` -> ``broker.topics``): of two with
    one name, the shallower (``broker.topics`` before ``broker.cli.topics``)."""
    found: dict[str, Any] = {}
    for module in sorted(_project_modules(), key=lambda m: m.__name__.count(".")):
        found.setdefault(module.__name__.rsplit(".", 1)[-1], module)
    return found


def _instance_attributes(cls: type) -> set[str]:
    """What ``self.X = ...`` sets in the classes of ``cls``'s MRO, their slots and fields."""
    names: set[str] = set()
    for klass in cls.__mro__:
        if klass.__module__.split(".")[0] not in ("broker", "spark_jobs"):
            continue
        names.update(getattr(klass, "__slots__", ()))
        if dataclasses.is_dataclass(klass):
            names.update(f.name for f in dataclasses.fields(klass))
        try:
            source = inspect.getsource(klass)
        except (OSError, TypeError):
            continue
        names.update(re.findall(r"\bself\.([A-Za-z_]\w*)\s*(?::[^=\n]+)?=(?!=)", source))
    return names


def _has(cls: type, attr: str) -> bool:
    return hasattr(cls, attr) or attr in _instance_attributes(cls)


def _keywords(cls: type) -> set[str]:
    try:
        return set(inspect.signature(cls).parameters)
    except (TypeError, ValueError):
        return set()


def _name_problems(use: Use) -> Iterator[str]:
    classes = _classes()
    text = use.text
    if "/" in text or FILE.match(text) or TEST.match(text):
        return  # a file (``_file_problem``)
    for cls_name, args in CALL.findall(text):
        cls = classes.get(cls_name)
        if cls is None:
            continue
        for keyword in KEYWORD.findall(re.sub(r"\([^()]*\)", "()", args)):  # not a nested call's
            if keyword not in _keywords(cls):
                yield f"{use.where}: `{text}`: {cls_name} takes no {keyword}="
    for owner, attr, wildcard in ATTR.findall(text):
        cls = classes.get(ALIASES.get(owner, owner))
        if cls is None or not (owner[0].isupper() or owner in ALIASES):
            continue
        if wildcard:  # ``AckerConfig.adaptive_*``: some attribute begins so
            if not any(name.startswith(attr) for name in {*dir(cls), *_instance_attributes(cls)}):
                yield f"{use.where}: `{text}`: {cls.__name__} has no {attr}*"
        elif not _has(cls, attr):
            yield f"{use.where}: `{text}`: {cls.__name__} has no {attr}"
    for dotted in DOTTED.findall(text):
        problem = _dotted_problem(dotted)
        if problem:
            yield f"{use.where}: `{text}`: {problem}"
    for module_name, attr in MODULE_ATTR.findall(text):
        module = _modules().get(module_name)
        if module is None or module_name in ALIASES or module.__name__.startswith(NOT_MODULES):
            continue
        package = (ROOT / module.__name__.replace(".", "/")).is_dir()  # its submodules are not attributes
        if not hasattr(module, attr) and not package:
            yield f"{use.where}: `{text}`: {module.__name__} has no {attr}"


def _dotted_problem(dotted: str) -> str | None:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):  # the longest importable prefix, then attributes
        try:
            obj: Any = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for j, attr in enumerate(parts[i:], i):
            if inspect.isclass(obj) and _has(obj, attr):
                obj = getattr(obj, attr, None)
                continue
            if not hasattr(obj, attr):
                return f"{'.'.join(parts[:j])} has no {attr}"
            obj = getattr(obj, attr)
        return None
    return f"no module {parts[0]}"


def _file_problem(use: Use) -> str | None:
    text = use.text.rstrip(".,")
    if (m := PATH.match(text)) is not None:
        if not any(ROOT.glob(m.group(1).rstrip("/"))):
            return f"{use.where}: `{text}`: no such file"
    elif (m := TEST.match(text)) is not None:
        files = list((ROOT / "tests").rglob(m.group(1)))
        if not files:
            return f"{use.where}: `{text}`: no such test file"
        if m.group(2) and not any(re.search(rf"^def {m.group(2)}\(", f.read_text(), re.M) for f in files):
            return f"{use.where}: `{text}`: no such test"
    return None


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return next((action for action in parser._actions if flag in action.option_strings), None)


def _command_problems(use: Use) -> Iterator[str]:
    """Each word of ``replaybroker a b --flag x`` up to the first option or value names a
    subcommand; each ``--flag`` is an option of the last one (or of the top)."""
    try:
        words = shlex.split(use.text.split("#")[0].split("|")[0].split("&&")[0].split(";")[0])[1:]
    except ValueError:
        return
    top = parser = build_parser()
    path = ["replaybroker"]
    at_subcommand = True
    for word in words:
        if word.startswith("-"):
            flag = word.split("=")[0]
            action = _option(parser, flag) or _option(top, flag)
            if action is None:
                if flag.startswith("--"):
                    yield f"{use.where}: `{use.text}`: {' '.join(path)} has no {flag}"
                at_subcommand = False
            elif action.nargs != 0:  # its value follows: no subcommand after it
                at_subcommand = False
            continue
        sub = _subparsers(parser)
        if at_subcommand and sub:
            if word not in sub:
                if re.fullmatch(r"[a-z][a-z-]*", word):
                    yield f"{use.where}: `{use.text}`: {' '.join(path)} has no subcommand {word}"
                return
            parser = sub[word]
            path.append(word)
        else:
            at_subcommand = False


def test_the_docs_read_real_files() -> None:
    assert len(DOCS) >= 4 and sum(1 for _ in _spans()) > 500
    assert sum(1 for _ in _command_lines()) > 10


def test_names_of_the_project_the_docs_use_exist() -> None:
    problems = [p for use in _spans() for p in _name_problems(use)]
    assert not problems, "\n".join(problems)


def test_files_the_docs_name_exist() -> None:
    problems = [p for use in _spans() if (p := _file_problem(use))]
    assert not problems, "\n".join(problems)


def test_commands_the_docs_show_exist_with_their_flags() -> None:
    problems = [p for use in _command_lines() for p in _command_problems(use)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("TaskConfig.superseded_wait_s", "TaskConfig has no superseded_wait_s"),
        ("TaskConfig(serde=JsonSerde(), no_such=1)", "TaskConfig takes no no_such="),
        ("SourceConfig(max_pending=100)", None),
        ("AckerConfig.unlogged_ms", None),
        ("ctx.touch()", None),
        ("ctx.tuch()", "TaskContext has no tuch"),
        ("source.send_many(topic, records)", None),
        ("Source.sent", None),  # set in __init__
        ("broker.kafka_io.consumer_group_protocol", None),
        ("broker.client.Source", "no client"),
        ("topics.check", None),
        ("topics.verify", "broker.topics has no verify"),
    ],
)
def test_drift_is_found(text: str, found: str | None) -> None:
    problems = list(_name_problems(Use("doc", text)))
    if found is None:
        assert problems == []
    else:
        assert len(problems) == 1 and found in problems[0], problems


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("replaybroker dlq redrive --reason-prefix timeout", None),
        ("replaybroker dlq redrive --speed 10", "replaybroker dlq redrive has no --speed"),
        ("replaybroker topics create --namespace shop --partitions 4", None),
        ("replaybroker topics make --namespace shop", "replaybroker topics has no subcommand make"),
        ("replaybroker -v status --namespace shop", None),
    ],
)
def test_command_drift_is_found(text: str, found: str | None) -> None:
    problems = list(_command_problems(Use("doc", text)))
    if found is None:
        assert problems == []
    else:
        assert len(problems) == 1 and found in problems[0], problems
