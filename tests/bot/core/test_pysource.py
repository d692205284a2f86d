"""Parsing from several threads at once: the publishing worker, agent threads and the conductor
all parse train.py, and CPython 3.11's ast module is not safe for that (gh-106905)."""

from __future__ import annotations

import re
import sys
import threading
from pathlib import Path

import pytest

from bot.core import pysource

SOURCE = "\n".join(f"def f{i}(x):\n    return [(a, {{b: (c if d else e)}}) for a in x for b in a]" for i in range(40))


class _Cycle:
    """Garbage whose finalizer runs Python code, so the collector can switch threads in the middle
    of building a tree: how the bug shows in a service that makes garbage on other threads."""

    def __del__(self) -> None:
        sum(range(50))


def _make_garbage() -> None:
    for _ in range(100_000):
        a, b = _Cycle(), _Cycle()
        a.other, b.other = b, a


def test_parsing_on_several_threads_while_others_make_garbage_never_fails() -> None:
    # With ast.parse in place of pysource.parse, this failed with "SystemError: AST constructor
    # recursion depth mismatch" in each of three tries on Python 3.11.7.
    errors: list[BaseException] = []

    def parse_often() -> None:
        for _ in range(100):
            try:
                pysource.parse(SOURCE)
            except Exception as error:  # any failure is the finding
                errors.append(error)

    old_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    garbage = threading.Thread(target=_make_garbage)
    parsers = [threading.Thread(target=parse_often) for _ in range(4)]
    try:
        garbage.start()
        for thread in parsers:
            thread.start()
        for thread in parsers:
            thread.join()
        garbage.join()
    finally:
        sys.setswitchinterval(old_interval)
    assert errors == []


def test_bot_parses_python_only_through_pysource() -> None:
    bot = Path(pysource.__file__).parents[1]
    direct = [
        f"{path.relative_to(bot.parent)}:{number}"
        for path in sorted(bot.rglob("*.py"))
        if path.name != "pysource.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if re.search(r"\bast\.parse\(|\bcompile\(tree\b", line)
    ]
    assert direct == []


def test_a_parse_that_meets_one_outside_the_lock_is_made_again(monkeypatch) -> None:
    # the standard library's traceback module parses outside the lock (Python 3.11's carets)
    real, calls = pysource.ast.parse, []

    def clashing(text: str, filename: str = "<unknown>"):
        calls.append(text)
        if len(calls) == 1:
            raise SystemError("AST constructor recursion depth mismatch (before=39, after=38)")
        return real(text, filename)

    monkeypatch.setattr(pysource.ast, "parse", clashing)
    assert isinstance(pysource.parse("x = 1\n").body[0], pysource.ast.Assign) and len(calls) == 2


def test_another_system_error_is_not_hidden(monkeypatch) -> None:
    def broken(text: str, filename: str = "<unknown>"):
        raise SystemError("something else")

    monkeypatch.setattr(pysource.ast, "parse", broken)
    with pytest.raises(SystemError, match="something else"):
        pysource.parse("x = 1\n")
