"""Python source parsed into a syntax tree, safely from any thread.

CPython 3.11 counts the ast module's recursion depth in one counter per interpreter, not per
thread, so two threads that parse at once (the publishing worker sizing a kept train.py while an
agent thread checks its edit) can make either fail with "SystemError: AST constructor recursion
depth mismatch" (python/cpython gh-106905). Every `ast.parse` and every compile of a tree in bot/
goes through here, under one lock. Compiling source text never builds Python ast objects and
needs no lock. The standard library parses outside it (Python 3.11's traceback module does, for
the carets under an error's line, whenever a traceback is formatted on any thread), so a parse
that still meets that error is made again, a few times: the counter is set afresh at each parse.
"""

from __future__ import annotations

import ast
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

_LOCK = threading.Lock()
TRIES = 5  # parses that meet another thread's (the standard library's) before the error is raised


def parse(text: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(text, filename)`, one thread at a time. Raises SyntaxError or ValueError as it does."""
    return _again(lambda: ast.parse(text, filename))


def compile_tree(tree: ast.Module, filename: str) -> None:
    """Compile a parsed tree to check it (a SyntaxError where the parser let it through), one thread
    at a time."""
    _again(lambda: compile(tree, filename, "exec"))


def _again(step: Callable[[], T]) -> T:
    for tried in range(1, TRIES + 1):
        with _LOCK:
            try:
                return step()
            except SystemError as error:  # another thread parsed outside the lock meanwhile
                if "recursion depth mismatch" not in str(error) or tried == TRIES:
                    raise
    raise AssertionError("unreachable")
