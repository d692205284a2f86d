"""How much smaller a train.py is than main's, counted on the code itself, not on its text.

program.md asks for simpler code: an equal result from less code is a win. The judge gives such a
change its own rule (see bot.loop.judge), so "smaller" must be something an agent cannot reach by
rearranging the text. Both texts are parsed and written back by `ast.unparse`, without docstrings
and other bare string statements, which gives one canonical layout: one statement (or compound
header, or decorator) a line, no comments, no blank lines, no redundant parentheses, lines joined
with `;` split again and long expressions on one line. Two things are counted on that text:

- lines of code: its lines, in effect the statements;
- code tokens: its names, keywords, operators and literals (Python's tokenizer, without the
  line-break and indentation tokens).

A change is smaller when it has fewer of both. Deleting comments or docstrings, joining or
splitting lines, renaming to shorter names or packing two assignments into one tuple assignment
(one line fewer, a token more) do not count; deleting a statement, a constant and its uses, a
branch or a layer does. Parameters are not counted: counting them needs the model built, and a
smaller model is a change of size, not of simplicity.
"""

from __future__ import annotations

import ast
import io
import tokenize
from dataclasses import dataclass

from bot.core import pysource, textcache

_NOT_CODE = {
    tokenize.NEWLINE,
    tokenize.NL,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.COMMENT,
    tokenize.ENCODING,
    tokenize.ENDMARKER,
}


@dataclass(frozen=True)
class Size:
    lines: int  # lines of code in the canonical layout
    tokens: int  # code tokens in the canonical layout


@dataclass(frozen=True)
class Simplification:
    """How much smaller a change makes train.py: both counts are positive."""

    lines: int  # lines of code removed
    tokens: int  # code tokens removed

    def words(self) -> str:
        """`37 fewer lines of code (412 fewer code tokens)`."""
        lines = "1 fewer line" if self.lines == 1 else f"{self.lines} fewer lines"
        tokens = "1 fewer code token" if self.tokens == 1 else f"{self.tokens} fewer code tokens"
        return f"{lines} of code ({tokens})"


def _without_bare_strings(tree: ast.Module) -> ast.Module:
    """The tree without docstrings and other string statements: they are comments, not code. A body
    left empty gets a `pass`, as it would need one in the source."""
    for node in ast.walk(tree):
        for field in ("body", "orelse", "finalbody"):
            body = getattr(node, field, None)
            if not isinstance(body, list) or not body or not isinstance(body[0], ast.stmt):
                continue
            kept = [
                s
                for s in body
                if not (
                    isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant) and isinstance(s.value.value, str)
                )
            ]
            if len(kept) != len(body):
                setattr(node, field, kept or ([] if isinstance(node, ast.Module) else [ast.Pass()]))
    return tree


@textcache.by_digest
def size(text: str) -> Size | None:
    """The size of a train.py's code, or None when it does not parse. Cached: main's text is sized
    again at every decision."""
    try:
        tree = pysource.parse(text)
    except (SyntaxError, ValueError):
        return None
    code = ast.unparse(_without_bare_strings(tree))
    tokens = sum(1 for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type not in _NOT_CODE)
    return Size(lines=len([line for line in code.splitlines() if line.strip()]), tokens=tokens)


def simplification(before: str, after: str) -> Simplification | None:
    """How much smaller `after` is than `before`, or None when it is not smaller in both lines of
    code and code tokens (or either does not parse)."""
    old, new = size(before), size(after)
    if old is None or new is None or new.lines >= old.lines or new.tokens >= old.tokens:
        return None
    return Simplification(lines=old.lines - new.lines, tokens=old.tokens - new.tokens)
