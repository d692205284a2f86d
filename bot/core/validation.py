"""What a proposal must be before anything is pushed or run: the conductor's checks, from any agent.

A proposal names a title and the full text of its task's asset (runner.tasks: train.py, router.py,
query.sql). Every asset stays under a size limit and must be new: not main's, not any earlier
experiment's, compared after normalising away what does not change what runs, so that a change to a
comment is not an experiment. A Python asset is compared by its syntax tree; a SQL asset by its
tokens, without comments or layout, in one case outside string literals (which stay as written).

Then a cheap static check per task, for what the evaluator's gate would only find after a run was
paid for:
- train.py compiles and keeps using the harness (`from runner import harness` and
  `harness.session()`: the harness owns data, clock and evaluation, so a train.py that drops it
  measures nothing);
- router.py compiles and still defines, at module level, the functions the evaluator calls
  (`train` and `route`);
- query.sql is index statements (`CREATE INDEX ...;`, and `ANALYZE`) followed by exactly one query
  (`SELECT` or `WITH`), checked by the evaluator's own parser (runner.tasks.query_latency.asset),
  so a proposal is refused here in the words its run would be. Whether the query returns the
  reference's rows, and what each statement may really do, is the evaluator's gate: it runs the
  text against the database under an authorizer.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterable

from bot.core import pysource, textcache
from runner.tasks import DEFAULT_TASK, get_task
from runner.tasks.query_latency import asset as query_asset

MAX_ASSET_BYTES = 200_000
# The module-level functions the evaluator of a Python asset calls (training's train.py is a script
# that uses the harness instead).
ENTRY_POINTS = {"ticket-routing": ("train", "route")}
# A SQL text in pieces: comments, string literals and quoted names, or anything else up to the next one.
_SQL_TOKEN = re.compile(r"'(?:[^']|'')*'?|\"(?:[^\"]|\"\")*\"?|[\w$:@?]+|<>|<=|>=|!=|==|\|\||\S")
_SQL_PIECE = re.compile(r"--[^\n]*|/\*.*?(?:\*/|\Z)|'(?:[^']|'')*'?|\"(?:[^\"]|\"\")*\"?|[^-/'\"]+|.", re.DOTALL)


def is_sql(task: str) -> bool:
    return get_task(task).asset.endswith(".sql")


def sql_statements(text: str) -> list[str]:
    """The statements of a SQL text without comments, each as its tokens one space apart (in lower
    case outside string literals) and without its `;`; empty statements dropped. A semicolon inside
    a string literal does not split."""
    statements, current = [], []
    for piece in _SQL_PIECE.findall(text):
        if piece.startswith(("--", "/*")):
            current.append(" ")
        elif piece.startswith(("'", '"')):
            current.append(piece)
        else:
            *ended, rest = piece.split(";")
            for part in ended:
                statements.append("".join(current) + part)
                current = []
            current.append(rest)
    statements.append("".join(current))
    return [s for s in (_squeeze(s) for s in statements) if s]


def _squeeze(statement: str) -> str:
    """The statement's tokens, one space apart, in lower case outside string literals."""
    return " ".join(t if t.startswith("'") else t.lower() for t in _SQL_TOKEN.findall(statement))


@textcache.by_digest
def normal_hash(text: str, task: str = DEFAULT_TASK, /) -> str | None:
    """The identity of the asset itself (a Python asset's syntax tree, a SQL asset's normalised
    statements), or None if a Python asset does not parse. Cached: main's text is checked again at
    every proposal."""
    if is_sql(task):
        return hashlib.sha256(";\n".join(sql_statements(text)).encode()).hexdigest()
    try:
        tree = pysource.parse(text)
    except (SyntaxError, ValueError):
        return None
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


def uses_harness(tree: ast.Module) -> bool:
    """`from runner import harness` (or `import runner.harness`) and a call of `harness.session()`."""
    imported = any(
        (isinstance(node, ast.ImportFrom) and node.module == "runner" and any(a.name == "harness" for a in node.names))
        or (isinstance(node, ast.Import) and any(a.name == "runner.harness" for a in node.names))
        for node in ast.walk(tree)
    )
    called = any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "session"
        and (
            isinstance(node.func.value, ast.Name)
            and node.func.value.id == "harness"
            or isinstance(node.func.value, ast.Attribute)
            and node.func.value.attr == "harness"
        )
        for node in ast.walk(tree)
    )
    return imported and called


def module_functions(tree: ast.Module) -> set[str]:
    """The names a module defines as functions at its top level (`def`, not async)."""
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}


def problem(
    title: str,
    asset: str,
    *,
    main_asset: str,
    earlier: Iterable[tuple[int, str, str | None]],
    task: str = DEFAULT_TASK,
    max_bytes: int = MAX_ASSET_BYTES,
) -> str | None:
    """Why the proposal cannot run, or None. `earlier`: (experiment id, title, normal_hash) of every
    experiment so far; `task`: the loop's task (runner.tasks), whose asset `asset` is."""
    if not title.strip():
        return "it has no title"
    name = get_task(task).asset
    size = len(asset.encode("utf-8"))
    if size > max_bytes:
        return f"{name} is {size:,} bytes, more than the limit of {max_bytes:,}"
    why = (_sql_problem if is_sql(task) else _python_problem)(asset, name, task)
    if why is not None:
        return why
    digest = normal_hash(asset, task)
    if digest == normal_hash(main_asset, task):
        return f"{name} is identical to main's (up to comments and layout)"
    for exp_id, exp_title, other in earlier:
        if other == digest:
            return f"it repeats experiment {exp_id} ({exp_title!r}) up to comments and layout"
    return None


def _python_problem(asset: str, name: str, task: str) -> str | None:
    try:
        tree = pysource.parse(asset, name)
        pysource.compile_tree(tree, name)
    except SyntaxError as error:
        return f"{name} does not compile: {error.msg} (line {error.lineno})"
    except ValueError as error:  # a NUL byte, say
        return f"{name} does not compile: {error}"
    if task == DEFAULT_TASK and not uses_harness(tree):
        return (
            f"{name} no longer uses the harness (`from runner import harness` and `h = harness.session()`): "
            "the harness owns the data, the clock and the evaluation, so keep both"
        )
    missing = [f for f in ENTRY_POINTS.get(task, ()) if f not in module_functions(tree)]
    if missing:
        wanted = " and ".join(f"{f}()" for f in ENTRY_POINTS[task])
        return (
            f"{name} no longer defines {', '.join(f'{f}()' for f in missing)} at module level: the evaluator "
            f"calls {wanted}, so keep them as plain functions (`def`) at the top level"
        )
    return None


def _sql_problem(asset: str, name: str, task: str) -> str | None:
    """The evaluator's own shape check (runner.tasks.query_latency.asset.parse): refused here in the
    words the run would be refused in, before a run is paid for."""
    try:
        query_asset.parse(asset)
    except query_asset.AssetRefused as refusal:
        return str(refusal)
    return None
