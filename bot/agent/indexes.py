"""The offline explorer on query.sql: one index more, or one index fewer, per proposal.

query.sql (the query-latency task: CREATE INDEX statements, then one query) has no constants to
tune; its knobs are its indexes. The explorer reads the query for the columns it filters or joins
on: a column beside a comparison (`=`, `<>`, `!=`, `<`, `<=`, `>`, `>=`, `BETWEEN`, `LIKE`, `IS`,
`IN (...)`), `alias.column` with the alias found through `FROM`/`JOIN table [AS] alias`, or a bare
column where the query names only one table. A column named `id` or `rowid` is taken for the
table's primary key, which SQLite indexes already. Its arms:

* add: `CREATE INDEX idx_<table>_<column> ON <table> (<column>);` on such a column that no index
  of query.sql leads with yet, placed after the asset's last index statement;
* drop: one of query.sql's CREATE INDEX statements left out (an index the plan does not use costs
  nothing to drop, and the judge keeps a smaller asset that is no worse).

An arm's score is a prior (an index for a join before one for a filter, in the order the query
names them, then the drops), plus what history says of the same arm on any main (keep +1, a
discard that hurt -1, one that improved without being kept +0.25, a crash -1; recent outcomes
weigh more, as bot.agent.arms weighs them), plus a seeded jitter: the same seed, main and history
give the same proposal. The best arm whose asset is new is proposed; the query itself is never
rewritten (that is the Claude agent's or a person's work). When every arm was tried from this
main, AgentStopped says so and what to do.
"""

from __future__ import annotations

import hashlib
import random
import re
import sqlite3
from dataclasses import dataclass
from typing import Any

from bot.agent.arms import RECENCY_DECAY, outcome_reward
from bot.core.protocols import AgentStopped
from bot.core.records import HistoryEntry, Proposal, ProposalContext, code_hash
from bot.core.states import NO_NUMBER
from bot.core.validation import sql_statements
from runner.tasks import Task

JITTER = 0.02  # seeded noise on every arm's score: below a join's lead over a filter, above the order step
ORDER_STEP = 0.01  # how much each later column in the query's order gives up
PRIOR = {"join": 0.3, "filter": 0.2, "drop": 0.0}
PRIMARY_KEYS = frozenset({"id", "rowid"})
_IDENT = r"[a-z_][a-z0-9_]*"
_OPERAND = rf"(?:{_IDENT}\.)?{_IDENT}|[:@$?][a-z0-9_]*|''|\d+(?:\.\d+)?"
_COMPARISON = re.compile(
    rf"({_OPERAND})\s*(=|==|<>|!=|<=|>=|<|>|\bnot\s+like\b|\blike\b|\bbetween\b|\bis\s+not\b|\bis\b)\s*({_OPERAND})"
)
_IN_LIST = re.compile(rf"((?:{_IDENT}\.)?{_IDENT})\s+(?:not\s+)?in\s*\(")
_TABLE = re.compile(rf"\b(?:from|join)\s+({_IDENT})(?:\s+(?:as\s+)?({_IDENT}))?")
_INDEX = re.compile(rf"create (?:unique )?index (?:if not exists )?({_IDENT}) on ({_IDENT}) \( ({_IDENT})")
_KEYWORDS = frozenset(
    "where join on left right inner outer cross natural full group order limit having union using as select "
    "from and or not is null in like between exists case when then else end".split()
)


@dataclass(frozen=True)
class Span:
    """One statement of query.sql: where it lies in the text, and its normalised form."""

    start: int
    end: int
    normal: str  # bot.core.validation.sql_statements' form: tokens one space apart, lower case


@dataclass(frozen=True)
class Column:
    table: str
    column: str
    use: str  # "join" or "filter"
    where: str  # the comparison it was found in, as the query writes it (normalised)


@dataclass
class IndexArm:
    key: str  # "add orders(customer_id)" or "drop idx_orders_customer": what history records
    action: str  # "add" or "drop"
    column: Column | None = None  # add: the column
    span: Span | None = None  # drop: the statement
    name: str = ""  # the index's name
    score: float = 0.0
    tried: list[HistoryEntry] | None = None


def statements(text: str) -> list[Span]:
    """query.sql's statements in order (empty ones left out). A `;` ends a statement where SQLite
    says the text up to it is complete, so one inside a string or a comment does not."""
    spans, start = [], 0
    for end, char in enumerate(text):
        if char == ";" and sqlite3.complete_statement(text[start : end + 1]):
            spans.append((start, end + 1))
            start = end + 1
    spans.append((start, len(text)))
    found = []
    for a, b in spans:
        normal = sql_statements(text[a:b])
        if normal:
            found.append(Span(a, b, normal[0]))
    return found


def query_columns(query: str) -> list[Column]:
    """The columns the query filters or joins on, each once, in the order the query names them."""
    (text,) = sql_statements(query) or [""]
    text = re.sub(r"'(?:[^']|'')*'", "''", text).replace(" . ", ".")  # literals say nothing of columns
    aliases: dict[str, str] = {}
    for m in _TABLE.finditer(text):
        table, alias = m.group(1), m.group(2)
        if table in _KEYWORDS:
            continue
        aliases.setdefault(table, table)
        if alias and alias not in _KEYWORDS:
            aliases[alias] = table
    tables = set(aliases.values())
    found: dict[tuple[str, str], Column] = {}

    def column_of(operand: str) -> tuple[str, str] | None:
        if "." in operand:
            alias, column = operand.split(".", 1)
            table = aliases.get(alias)
        elif len(tables) == 1 and re.fullmatch(_IDENT, operand) and operand not in _KEYWORDS:
            table, column = next(iter(tables)), operand
        else:
            return None
        return None if table is None or column in PRIMARY_KEYS else (table, column)

    for m in _COMPARISON.finditer(text):
        left, right = m.group(1), m.group(3)
        sides = [column_of(left), column_of(right)]
        both = all(re.fullmatch(rf"{_IDENT}\.{_IDENT}", o) for o in (left, right))
        for side in sides:
            if side is not None and side not in found:
                found[side] = Column(*side, "join" if both else "filter", m.group(0))
    for m in _IN_LIST.finditer(text):
        side = column_of(m.group(1))
        if side is not None and side not in found:
            found[side] = Column(*side, "filter", m.group(0) + "...)")
    return list(found.values())


def propose_index(ctx: ProposalContext, task: Task, seed: int) -> Proposal:
    """The next index edit of query.sql (module docstring); AgentStopped when none is left."""
    spans = statements(ctx.asset)
    if not spans or not spans[-1].normal.startswith(("select", "with")):
        raise AgentStopped(
            f"the explorer cannot read {task.asset} on main: it must end with its one query (SELECT or WITH), "
            "after its CREATE INDEX statements; fix it on main"
        )
    query, setup = spans[-1], spans[:-1]
    indexes = {m.group(1): (m.group(2), m.group(3), span) for span in setup if (m := _INDEX.match(span.normal))}
    leading = {(table, column) for table, column, _ in indexes.values()}
    columns = query_columns(ctx.asset[query.start : query.end])
    rng = random.Random(_seed(seed, ctx))
    arms: list[IndexArm] = []
    for order, col in enumerate(columns):
        name = f"idx_{col.table}_{col.column}"
        if (col.table, col.column) in leading or name in indexes:
            continue
        arms.append(IndexArm(f"add {col.table}({col.column})", "add", column=col, name=name))
        arms[-1].score = PRIOR[col.use] - ORDER_STEP * order
    for name, (_, _, span) in indexes.items():
        arms.append(IndexArm(f"drop {name}", "drop", span=span, name=name, score=PRIOR["drop"]))
    for arm in arms:
        arm.score += _learned(arm.key, ctx.history) + rng.random() * JITTER
    main_hash = code_hash(ctx.asset)
    for arm in sorted(arms, key=lambda a: (-a.score, a.key)):
        text = _added(ctx.asset, setup, query, arm) if arm.action == "add" else _dropped(ctx.asset, arm.span)
        if code_hash(text) == main_hash or code_hash(text) in ctx.seen_hashes:
            continue
        return _proposal(arm, text, task, seed, ctx.history)
    looked = ", ".join(f"{c.table}.{c.column}" for c in columns) or "none found"
    raise AgentStopped(
        f"explorer exhausted: every index edit of {task.asset} from the current main was already tried (columns "
        f"the query filters or joins on: {looked}; indexes it creates: {', '.join(indexes) or 'none'}). Rewrite "
        "the query by hand, or configure an LLM agent, which may rewrite it."
    )


def _seed(seed: int, ctx: ProposalContext) -> int:
    key = f"{seed}|{code_hash(ctx.asset)}|{len(ctx.history)}|indexes"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def _arm_of(entry: HistoryEntry) -> str | None:
    changes = (entry.meta or {}).get("changes") if isinstance(entry.meta, dict) else None
    if isinstance(changes, list) and len(changes) == 1 and isinstance(changes[0], dict):
        arm = changes[0].get("index")
        return arm if isinstance(arm, str) else None
    return None


def _learned(key: str, history: list[HistoryEntry]) -> float:
    """What earlier tries of the same arm say: their weighted mean reward, shrunk towards 0."""
    total, weights = 0.0, 0.0
    for age, entry in enumerate(reversed(history)):
        reward = outcome_reward(entry)
        if reward is None or _arm_of(entry) != key:
            continue
        weight = RECENCY_DECAY**age
        total, weights = total + weight * reward, weights + weight
    return total / (weights + 1.0)


def _added(text: str, setup: list[Span], query: Span, arm: IndexArm) -> str:
    col = arm.column
    assert col is not None
    statement = f"CREATE INDEX {arm.name} ON {col.table} ({col.column});"
    if setup:
        at = setup[-1].end
        return text[:at] + "\n" + statement + text[at:]
    lead = re.match(r"(?:\s+|--[^\n]*|/\*.*?\*/)*", text[query.start : query.end], re.DOTALL)
    at = query.start + (lead.end() if lead else 0)
    return text[:at] + statement + "\n\n" + text[at:]


def _dropped(text: str, span: Span | None) -> str:
    assert span is not None
    start = span.start + (len(text[span.start : span.end]) - len(text[span.start : span.end].lstrip()))
    end = span.end
    rest = re.match(r"[ \t]*\n?", text[end:])
    return text[:start] + text[end + (rest.end() if rest else 0) :]


def _proposal(arm: IndexArm, text: str, task: Task, seed: int, history: list[HistoryEntry]) -> Proposal:
    metric = task.metric.name
    if arm.action == "add":
        col = arm.column
        assert col is not None
        title = f"Add an index on {col.table}({col.column})"
        how = "joins" if col.use == "join" else "filters"
        body = (
            f"The query {how} {col.table} on {col.column} (`{col.where}`), and no index of {task.asset} leads with "
            f"that column, so SQLite may scan {col.table} where it could seek. An index on {col.table}({col.column}) "
            f"lets the plan look the rows up instead. Building it is done before the timed executions, so it "
            f"costs nothing in {metric}."
        )
    else:
        title = f"Drop the index {arm.name}"
        body = (
            f"{task.asset} creates {arm.name}. If the plan does not use it, or uses it where reading the table is "
            f"cheaper, leaving it out costs nothing or helps, and a smaller {task.asset} that is no worse is kept."
        )
    earlier = [e for e in history if _arm_of(e) == arm.key and e.status in ("keep", "discard", *NO_NUMBER)]
    if earlier:
        last = earlier[-1]
        delta = "" if last.delta is None else f", {task.metric.format_change(last.delta)} {metric}"
        body += f" The same edit on an earlier main (experiment #{last.id}) ended {last.status}{delta}; main has changed since."
    body += f" Nothing else changes, so any difference in {metric} can be attributed to this one index."
    explain: dict[str, Any] = {"seed": seed, "arm": arm.key, "score": round(arm.score, 4)}
    change = {"name": arm.name, "index": arm.key, "action": arm.action}
    return Proposal(title=title, hypothesis=body, asset=text, meta={"changes": [change], "explorer": explain})
