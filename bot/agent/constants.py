"""Reading and editing the constants of a Python asset (train.py, router.py) through its syntax tree.

`find_constants` finds every module-level ``NAME = literal`` (a number, a string, True or False)
and where its value sits in the source; `apply_edits` replaces exactly those spans, leaving every other byte as it was;
`format_value` writes a new value in the style of the old one (``2**19`` stays a power).
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from bot.agent.knobs import FLAG, INT, MULT, POW2, Knob
from bot.core import pysource
from bot.core.protocols import AgentStopped


@dataclass
class Constant:
    """A module-level `NAME = literal` of the asset and where its value sits in the source."""

    name: str
    value: int | float | str | bool
    lineno: int  # 1-based
    start: int  # character offsets of the value within its line
    end: int
    source: str  # the value as written
    pow2: bool  # written as 2**N


def _eval_literal(node: ast.AST) -> int | float | str | bool:
    """Evaluate a literal, a signed literal or arithmetic on numeric literals (2**19, 3e-4 * 2)."""
    if isinstance(node, ast.Constant) and type(node.value) is bool:
        return node.value
    if isinstance(node, ast.Constant) and type(node.value) in (int, float, str):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_literal(node.operand)
        if isinstance(v, (str, bool)):
            raise ValueError("sign on a string or a flag")
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Pow, ast.Mult, ast.Div, ast.Add, ast.Sub)):
        a, b = _eval_literal(node.left), _eval_literal(node.right)
        if isinstance(a, (str, bool)) or isinstance(b, (str, bool)):
            raise ValueError("arithmetic on a string or a flag")
        if isinstance(node.op, ast.Pow):
            if abs(b) > 64:
                raise ValueError("exponent too large")
            return a**b
        if isinstance(node.op, ast.Mult):
            return a * b
        if isinstance(node.op, ast.Div):
            return a / b
        return a + b if isinstance(node.op, ast.Add) else a - b
    raise ValueError(f"not a literal: {ast.dump(node)}")


def _is_pow2_expr(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Pow)
        and isinstance(node.left, ast.Constant)
        and node.left.value == 2
        and isinstance(node.right, ast.Constant)
        and type(node.right.value) is int
    )


def _char_offset(line: str, byte_offset: int) -> int:
    return len(line.encode("utf-8")[:byte_offset].decode("utf-8", errors="replace"))


def find_constants(text: str) -> dict[str, Constant]:
    """All module-level constants of the asset, by name. Names assigned more than once are left out."""
    try:
        tree = pysource.parse(text)
    except SyntaxError as exc:
        raise AgentStopped(f"explorer cannot parse the asset on main: {exc}") from exc
    lines = text.splitlines(keepends=True)
    found: dict[str, Constant] = {}
    assigned: dict[str, int] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        elif isinstance(node, ast.AugAssign):
            targets, value = [node.target], None
        else:
            continue
        for t in targets:
            for n in ast.walk(t):
                if isinstance(n, ast.Name):
                    assigned[n.id] = assigned.get(n.id, 0) + 1
        if value is None or len(targets) != 1 or not isinstance(targets[0], ast.Name):
            continue
        if value.lineno != value.end_lineno:
            continue
        try:
            v = _eval_literal(value)
        except (ValueError, ZeroDivisionError, OverflowError, TypeError):
            continue
        line = lines[value.lineno - 1]
        start, end = _char_offset(line, value.col_offset), _char_offset(line, value.end_col_offset)
        found[targets[0].id] = Constant(
            name=targets[0].id,
            value=v,
            lineno=value.lineno,
            start=start,
            end=end,
            source=line[start:end],
            pow2=_is_pow2_expr(value),
        )
    return {name: c for name, c in found.items() if assigned.get(name) == 1}


def apply_edits(text: str, edits: list[tuple[Constant, str]]) -> str:
    """Replace exactly the source span of each constant's value; every other byte stays as it was."""
    lines = text.splitlines(keepends=True)
    for const, new_src in sorted(edits, key=lambda e: (e[0].lineno, e[0].start), reverse=True):
        line = lines[const.lineno - 1]
        lines[const.lineno - 1] = line[: const.start] + new_src + line[const.end :]
    return "".join(lines)


def format_value(knob: Knob, const: Constant, new: int | float | str | bool) -> str:
    """Python source for a new value, in the style the old one was written."""
    if knob.kind == FLAG:
        return repr(bool(new))
    if isinstance(new, str):
        quote = const.source[0] if const.source[:1] in ("'", '"') else '"'
        return f"{quote}{new}{quote}"
    if knob.kind in (INT, POW2, MULT):
        n = int(new)
        if const.pow2 and n > 0 and n & (n - 1) == 0:
            return f"2**{n.bit_length() - 1}"
        return str(n)
    if isinstance(const.value, int) and float(new).is_integer():
        return str(int(new))
    return repr(float(new))


def compiles(text: str) -> bool:
    """Whether the edited asset is still valid Python."""
    try:
        compile(text, "asset", "exec")
    except SyntaxError:
        return False
    return True
