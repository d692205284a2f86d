"""What a proposal must be before anything is pushed or run: the conductor's checks, from any agent.

A proposal names a title and a full train.py. train.py must compile, stay under a size limit, keep
using the harness (`from runner import harness` and `harness.session()`: the harness owns data,
clock and evaluation, so a train.py that drops it measures nothing), and be new: not main's, not
any earlier experiment's, compared after normalising away whitespace, comments and layout (the
code's syntax tree), so a change to a comment is not an experiment.
"""

from __future__ import annotations

import ast
import functools
import hashlib
from collections.abc import Iterable

MAX_ASSET_BYTES = 200_000


@functools.lru_cache(maxsize=32)
def normal_hash(text: str) -> str | None:
    """The identity of the code itself (its syntax tree), or None if it does not parse. Cached:
    main's text is checked again at every proposal."""
    try:
        tree = ast.parse(text)
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


def problem(
    title: str,
    asset: str,
    *,
    main_asset: str,
    earlier: Iterable[tuple[int, str, str]],
    max_bytes: int = MAX_ASSET_BYTES,
) -> str | None:
    """Why the proposal cannot run, or None. `earlier`: (experiment id, title, normal_hash) of every
    experiment so far."""
    if not title.strip():
        return "it has no title"
    size = len(asset.encode("utf-8"))
    if size > max_bytes:
        return f"train.py is {size:,} bytes, more than the limit of {max_bytes:,}"
    try:
        tree = ast.parse(asset, "train.py")
        compile(tree, "train.py", "exec")
    except SyntaxError as error:
        return f"train.py does not compile: {error.msg} (line {error.lineno})"
    except ValueError as error:  # a NUL byte, say
        return f"train.py does not compile: {error}"
    if not uses_harness(tree):
        return (
            "train.py no longer uses the harness (`from runner import harness` and `h = harness.session()`): "
            "the harness owns the data, the clock and the evaluation, so keep both"
        )
    digest = hashlib.sha256(ast.dump(tree).encode()).hexdigest()
    if digest == normal_hash(main_asset):
        return "train.py is identical to main's (up to comments and layout)"
    for exp_id, exp_title, other in earlier:
        if other == digest:
            return f"it repeats experiment {exp_id} ({exp_title!r}) up to comments and layout"
    return None
