"""Python source parsed into a syntax tree, safely from any thread.

CPython 3.11 counts the ast module's recursion depth in one counter per interpreter, not per
thread, so two threads that parse at once (the publishing worker sizing a kept train.py while an
agent thread checks its edit) can make either fail with "SystemError: AST constructor recursion
depth mismatch" (python/cpython gh-106905). Every `ast.parse` and every compile of a tree in bot/
goes through here, under one lock. Compiling source text never builds Python ast objects and
needs no lock.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(text: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(text, filename)`, one thread at a time. Raises SyntaxError or ValueError as it does."""
    with _LOCK:
        return ast.parse(text, filename)


def compile_tree(tree: ast.Module, filename: str) -> None:
    """Compile a parsed tree to check it (a SyntaxError where the parser let it through), one thread
    at a time."""
    with _LOCK:
        compile(tree, filename, "exec")
