"""The offline explorer on query.sql: one edit of its indexes (or its statistics) per proposal.

query.sql (the query-latency task: CREATE INDEX and ANALYZE statements, then one query) has no
constants to tune; its knobs are its indexes. The explorer never connects to a database and never
rewrites the query (that is the Claude agent's or a person's work): it reads the query with
bot.agent.sql_columns, which follows every column the query filters, joins, groups or orders on
back to its table through aliases, common table expressions, derived tables and correlated
subqueries, with program.md's schema (its CREATE TABLE statements or its `table (col, ...)` lines
in a sql block) for bare names. A column named `id` or `rowid`, or declared INTEGER PRIMARY KEY, is
the table's key, which SQLite indexes already. Its arms, each an edit of query.sql's setup:

* start: let the plan start at a filtered table. One composite index on its filter columns
  (the equality columns in the query's order, then its first range column), plus, for every table
  the plan must reach from there by a join on a column that is not a key, an index on that join
  column, in the same edit. Alone, the filter's index can make SQLite start there and then scan the
  joined table once per row it finds: on the bundled starter, orders(status, ordered_at) without
  order_items(order_id) made the smoke-scale query some 25 times slower than no index at all, and
  with it the cpu-scale query ran some 20 times faster (one timing of each on a shared machine).
  Also one arm per single filter column, with the same join indexes.
* cover: the start arm's filter columns, then a join column of the same table (`o.customer_id`),
  so the plan reads the join's key from the index without visiting the table.
* sort: the table's equality columns, then a column the query groups or orders by, so rows come
  out of the index in that order and the sort goes.
* join: an index on one join column that is not a key (`order_items(order_id)`).
* subquery filter: an index on a column whose value the query computes per row in a scalar
  subquery (`(SELECT c.region FROM customers AS c WHERE c.id = o.customer_id) = :region`). No index
  finds rows by such a value as the query is written, so these come last among the additions.
* analyze: `ANALYZE;` after the indexes, so the planner knows the tables' sizes and how selective
  each index is (with no index it learns only the sizes).
* drop: one of query.sql's CREATE INDEX or ANALYZE statements left out (an index the plan does not
  use costs nothing to drop, and the judge keeps a smaller asset that is no worse).

An index already led by the arm's columns (or the table's key) is not created again; where an
index of query.sql is a prefix of the arm's composite (orders(status, ordered_at) for the cover
arm's orders(status, ordered_at, customer_id)), the edit widens that statement in place. New
CREATE INDEX statements go before query.sql's first ANALYZE (whose statistics should include
them), else after its last setup statement.

An arm's score is its prior (start, then cover, then sort and analyze, then join, then a start
arm on a single filter column, then subquery filter, then ANALYZE where query.sql has no index yet,
then drop; a start or cover arm gains a little for each filter column of its composite, and each
later table or column in the query's order gives up a little), plus what history says of it
(bot.agent.arms' rewards, recent outcomes weighing more: keep +1, a discard that hurt -1, one that
improved without being kept +0.25, a crash or rejection -1; an earlier edit that created one of the
same indexes counts half), plus a seeded jitter: the same seed, main and history give the same
proposal. The best arm whose asset is new is proposed; when every arm was tried from this main,
AgentStopped says so and what to do.

What it cannot find: a rewrite of the query (joins in place of correlated subqueries, a different
join order, pre-aggregation), an expression or partial index, an index serving an `OR`, `<>` or a
column inside a function, and which of two plausible indexes SQLite's planner will prefer: that is
what the runs measure.
"""

from __future__ import annotations

import hashlib
import random
import re
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from bot.agent.arms import RECENCY_DECAY, outcome_reward
from bot.agent.sql_columns import Use, query_uses, read_schema
from bot.core.protocols import AgentStopped
from bot.core.records import HistoryEntry, Proposal, ProposalContext, code_hash
from bot.core.validation import sql_statements
from runner.tasks import Task

JITTER = 0.02  # seeded noise on every arm's score: below the gap between two kinds of arm, above ORDER_STEP
ORDER_STEP = 0.01  # how much each later table or column in the query's order gives up
COLUMN_BONUS = 0.05  # a start or cover arm's gain for each filter column of its composite beyond the first
PRIOR = {
    "start": 0.4,
    "cover": 0.35,
    "sort": 0.3,
    "analyze": 0.3,
    "join": 0.25,
    "start single": 0.2,
    "subquery filter": 0.1,
    "analyze without indexes": 0.05,
    "drop": 0.0,
}
RELATED_WEIGHT = 0.5  # an earlier edit that created one of the arm's indexes counts this much of its own
PRIMARY_KEYS = frozenset({"id", "rowid"})
_IDENT = r"[a-z_][a-z0-9_]*"
_INDEX = re.compile(rf"create (?:unique )?index (?:if not exists )?({_IDENT}) on ({_IDENT}) \((.*?)\)(?: where .*)?$")


@dataclass(frozen=True)
class Span:
    """One statement of query.sql: where it lies in the text, and its normalised form."""

    start: int
    end: int
    normal: str  # bot.core.validation.sql_statements' form: tokens one space apart, lower case


@dataclass(frozen=True)
class Index:
    """An index by what it is made of: a table and its columns, in order."""

    table: str
    columns: tuple[str, ...]

    def label(self) -> str:
        return f"{self.table}({', '.join(self.columns)})"

    def name(self) -> str:
        return f"idx_{self.table}_{'_'.join(self.columns)}"


@dataclass(frozen=True)
class Existing:
    """One CREATE INDEX statement of query.sql."""

    name: str
    index: Index
    span: Span


@dataclass
class IndexArm:
    key: str  # what history records: "add orders(status, ordered_at) + order_items(order_id)", "drop idx_x", "add ANALYZE"
    kind: str  # a key of PRIOR
    creates: list[Index] = field(default_factory=list)  # add: the indexes query.sql does not have yet
    anchor: Index | None = None  # add: the arm's own index (a start arm's may exist already), the rest serve joins
    widens: dict[Index, Existing] = field(default_factory=dict)  # an index that replaces a narrower one of query.sql
    span: Span | None = None  # drop: the statement left out
    uses: list[Use] = field(default_factory=list)  # what the query does with the first index's columns
    score: float = 0.0


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


def existing_indexes(setup: list[Span]) -> list[Existing]:
    """query.sql's CREATE INDEX statements, each with its plain leading columns (an expression or a
    COLLATE ends the list: what follows is not a column this module compares)."""
    found = []
    for span in setup:
        m = _INDEX.match(span.normal)
        if not m:
            continue
        columns = []
        for part in m.group(3).split(","):
            words = part.split()
            if not words or not re.fullmatch(_IDENT, words[0]) or any(w not in ("asc", "desc") for w in words[1:]):
                break
            columns.append(words[0])
        found.append(Existing(m.group(1), Index(m.group(2), tuple(columns)), span))
    return found


def arms(query: str, setup: list[Span], program_md: str = "") -> list[IndexArm]:
    """Every edit the explorer may propose from this main, with its prior score."""
    uses = query_uses(query, program_md)
    keys = dict(read_schema(program_md)[1])
    existing = existing_indexes(setup)

    def is_key(table: str, column: str) -> bool:
        return _is_key(table, column, keys)

    def covered(index: Index) -> bool:
        if len(index.columns) == 1 and is_key(index.table, index.columns[0]):
            return True
        return any(
            e.index.table == index.table and e.index.columns[: len(index.columns)] == index.columns for e in existing
        )

    def reached_from(table: str) -> list[Index]:
        """The join indexes a plan starting at `table` needs to reach every table it joins, by a seek."""
        needed, seen, todo = [], {table}, [table]
        while todo:
            here = todo.pop(0)
            for use in uses:
                if use.kind != "join" or use.table != here or use.partner is None or use.partner[0] in seen:
                    continue
                other, column = use.partner
                seen.add(other)
                todo.append(other)
                if not is_key(other, column):
                    needed.append(Index(other, (column,)))
        return needed

    found: dict[str, IndexArm] = {}

    def offer(kind: str, first: Index, partners: list[Index], why: list[Use], order: int) -> None:
        creates = [i for i in dict.fromkeys([first, *partners]) if not covered(i)]
        if not creates or (first not in creates and kind not in ("start", "start single")):
            return  # a start arm whose index exists may still add the indexes its joins need
        widens = {}
        for index in creates:
            narrower = [e for e in existing if e.index.table == index.table and e.index.columns]
            narrower = [e for e in narrower if index.columns[: len(e.index.columns)] == e.index.columns]
            if narrower:
                widens[index] = narrower[0]
        arm = IndexArm("add " + " + ".join(i.label() for i in creates), kind, creates, first, widens, uses=why)
        arm.score = PRIOR[kind] - ORDER_STEP * order
        if kind in ("start", "cover"):
            arm.score += COLUMN_BONUS * (len({u.column for u in why if u.kind != "join"}) - 1)
        if arm.key not in found or found[arm.key].score < arm.score:
            found[arm.key] = arm

    tables = list(dict.fromkeys(u.table for u in uses))
    for order, table in enumerate(tables):
        filters = [u for u in uses if u.table == table and u.kind in ("equal", "range") and not u.through_subquery]
        equal = [u for u in filters if u.kind == "equal"]
        ranges = [u for u in filters if u.kind == "range" and u.column not in {e.column for e in equal}]
        lead = equal + ranges[:1]
        partners = reached_from(table)
        if lead:
            columns = tuple(dict.fromkeys(u.column for u in lead))
            offer("start", Index(table, columns), partners, lead, order)
            if len(columns) > 1:
                for k, use in enumerate(filters):
                    offer("start single", Index(table, (use.column,)), partners, [use], order + k)
            for use in uses:
                if use.kind == "join" and use.table == table and not is_key(table, use.column):
                    if use.column not in columns:
                        offer("cover", Index(table, (*columns, use.column)), partners, [*lead, use], order)
        for use in uses:
            if use.kind == "order" and use.table == table and equal and not is_key(table, use.column):
                columns = tuple(dict.fromkeys(u.column for u in equal))
                if use.column not in columns:
                    offer("sort", Index(table, (*columns, use.column)), partners, [*equal, use], order)
    for order, use in enumerate(uses):
        if use.kind == "join" and not is_key(use.table, use.column):
            offer("join", Index(use.table, (use.column,)), [], [use], order)
        elif use.kind in ("equal", "range") and use.through_subquery:
            offer("subquery filter", Index(use.table, (use.column,)), [], [use], order)
    analyzed = any(span.normal.startswith("analyze") for span in setup)
    if not analyzed:
        kind = "analyze" if existing else "analyze without indexes"
        found["add ANALYZE"] = IndexArm("add ANALYZE", kind, score=PRIOR[kind])
    for span in setup:
        m = _INDEX.match(span.normal)
        if m or span.normal.startswith("analyze"):
            key = f"drop {m.group(1)}" if m else "drop ANALYZE"
            found.setdefault(key, IndexArm(key, "drop", span=span, score=PRIOR["drop"]))
    return list(found.values())


def propose_index(ctx: ProposalContext, task: Task, seed: int) -> Proposal:
    """The next edit of query.sql's indexes (module docstring); AgentStopped when none is left."""
    spans = statements(ctx.asset)
    if not spans or not spans[-1].normal.startswith(("select", "with")):
        raise AgentStopped(
            f"the explorer cannot read {task.asset} on main: it must end with its one query (SELECT or WITH), "
            "after its CREATE INDEX statements; fix it on main"
        )
    query, setup = spans[-1], spans[:-1]
    candidates = arms(ctx.asset[query.start : query.end], setup, ctx.program_md)
    rng = random.Random(_seed(seed, ctx))
    for arm in candidates:
        arm.score += _learned(arm, ctx.history) + rng.random() * JITTER
    main_hash = code_hash(ctx.asset)
    for arm in sorted(candidates, key=lambda a: (-a.score, a.key)):
        text = _edited(ctx.asset, setup, query, arm)
        if code_hash(text) == main_hash or code_hash(text) in ctx.seen_hashes:
            continue
        return _proposal(arm, text, task, seed, ctx.history)
    uses = query_uses(ctx.asset[query.start : query.end], ctx.program_md)
    keys = read_schema(ctx.program_md)[1]
    columns = [f"{u.table}.{u.column}" for u in uses if u.kind != "order" and not _is_key(u.table, u.column, keys)]
    looked = ", ".join(dict.fromkeys(columns)) or "none found"
    made = ", ".join(e.name for e in existing_indexes(setup)) or "none"
    raise AgentStopped(
        f"explorer exhausted: every index edit of {task.asset} from the current main was already tried (columns "
        f"the query filters or joins on: {looked}; indexes it creates: {made}). Rewrite the query by hand, or "
        "configure an LLM agent, which may rewrite it."
    )


def _is_key(table: str, column: str, keys: dict[str, str]) -> bool:
    return column in PRIMARY_KEYS or keys.get(table) == column


def _and(words: tuple[str, ...] | list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _seed(seed: int, ctx: ProposalContext) -> int:
    key = f"{seed}|{code_hash(ctx.asset)}|{len(ctx.history)}|indexes"
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def _change_of(entry: HistoryEntry) -> dict[str, Any] | None:
    changes = (entry.meta or {}).get("changes") if isinstance(entry.meta, dict) else None
    if isinstance(changes, list) and len(changes) == 1 and isinstance(changes[0], dict):
        return changes[0] if isinstance(changes[0].get("index"), str) else None
    return None


def _learned(arm: IndexArm, history: list[HistoryEntry]) -> float:
    """What earlier tries say: the weighted mean reward of the same edit, and at half weight of
    edits that created one of the same indexes, shrunk towards 0."""
    labels = {i.label() for i in arm.creates}
    total, weights = 0.0, 0.0
    for age, entry in enumerate(reversed(history)):
        reward, change = outcome_reward(entry), _change_of(entry)
        if reward is None or change is None:
            continue
        if change["index"] == arm.key:
            weight = RECENCY_DECAY**age
        elif labels & set(change.get("creates") or []):
            weight = RELATED_WEIGHT * RECENCY_DECAY**age
        else:
            continue
        total, weights = total + weight * reward, weights + weight
    return total / (weights + 1.0)


def _edited(text: str, setup: list[Span], query: Span, arm: IndexArm) -> str:
    if arm.span is not None:
        return _dropped(text, arm.span)
    if not arm.creates:  # ANALYZE, after every index
        return _inserted(text, setup[-1].end if setup else None, query, ["ANALYZE;"])
    for index, old in sorted(arm.widens.items(), key=lambda kv: -kv[1].span.start):  # from the end: spans stay put
        text = text[: _own_start(text, old.span)] + _statement(index) + text[old.span.end :]
    new = [_statement(i) for i in arm.creates if i not in arm.widens]
    if not new:
        return text
    spans = statements(text)
    query, setup = spans[-1], spans[:-1]
    analyze = next((s for s in setup if s.normal.startswith("analyze")), None)
    if analyze is not None:
        at = _own_start(text, analyze)
        return text[:at] + "\n".join(new) + "\n" + text[at:]
    return _inserted(text, setup[-1].end if setup else None, query, new)


def _statement(index: Index) -> str:
    return f"CREATE INDEX {index.name()} ON {index.table} ({', '.join(index.columns)});"


def _inserted(text: str, after: int | None, query: Span, lines: list[str]) -> str:
    """`lines` after the setup statement ending at `after`, or before the query's first line."""
    if after is not None:
        return text[:after] + "\n" + "\n".join(lines) + text[after:]
    at = _own_start(text, query)
    return text[:at] + "\n".join(lines) + "\n\n" + text[at:]


def _own_start(text: str, span: Span) -> int:
    """Where the statement itself begins: after the blank lines and comments its span starts with."""
    lead = re.match(r"(?:\s+|--[^\n]*|/\*.*?\*/)*", text[span.start : span.end], re.DOTALL)
    return span.start + (lead.end() if lead else 0)


def _dropped(text: str, span: Span) -> str:
    """The text without the statement (the comments before it stay)."""
    start = _own_start(text, span)
    rest = re.match(r"[ \t]*\n?", text[span.end :])
    return text[:start] + text[span.end + (rest.end() if rest else 0) :]


def _proposal(arm: IndexArm, text: str, task: Task, seed: int, history: list[HistoryEntry]) -> Proposal:
    title, body = _write_up(arm, task)
    earlier = [e for e in history if (c := _change_of(e)) and c["index"] == arm.key and e.status != "running"]
    if earlier:
        last = earlier[-1]
        delta = (
            "" if last.delta is None else f", {task.metric.loss(last.delta):+.{task.metric.digits}f} {task.metric.name}"
        )
        body += f" The same edit on an earlier main (experiment #{last.id}) ended {last.status}{delta}; main has changed since."
    body += f" Nothing else changes, so any difference in {task.metric.name} can be attributed to this edit."
    explain: dict[str, Any] = {"seed": seed, "arm": arm.key, "kind": arm.kind, "score": round(arm.score, 4)}
    if arm.span is not None:
        old, new = arm.key.removeprefix("drop "), "none"
    elif arm.creates:
        old = ", ".join(e.index.label() for e in arm.widens.values()) or "none"
        new = ", ".join(i.label() for i in arm.creates)
    else:
        old, new = "no statistics", "ANALYZE"
    change = {"name": "indexes", "index": arm.key, "kind": arm.kind, "old": old, "new": new}
    change["creates"] = [i.label() for i in arm.creates]
    return Proposal(title=title, hypothesis=body, asset=text, meta={"changes": [change], "explorer": explain})


def _write_up(arm: IndexArm, task: Task) -> tuple[str, str]:
    asset, metric = task.asset, task.metric.name
    if arm.span is not None:
        name = arm.key.removeprefix("drop ")
        if name == "ANALYZE":
            return "Drop ANALYZE", (
                f"{asset} runs ANALYZE. Its statistics can lead the planner to a plan that is worse for this "
                f"workload's parameters; without them SQLite falls back to its default guesses."
            )
        return f"Drop the index {name}", (
            f"{asset} creates {name}. If the plan does not use it, or uses it where reading the table is "
            f"cheaper, leaving it out costs nothing or helps, and a smaller {asset} that is no worse is kept."
        )
    if not arm.creates:
        return "Add ANALYZE after the indexes", (
            f"{asset} creates indexes but gives the planner no statistics, so it guesses every table's size and "
            "every index's selectivity alike. ANALYZE measures them, and the planner can then choose where to "
            f"start and which index to use. It runs before the timed executions, so it costs nothing in {metric}."
        )
    first = arm.anchor or arm.creates[0]
    rest = [i for i in arm.creates if i != first]
    verb = f"Widen {arm.widens[first].name} to" if first in arm.widens else "Add an index on"
    title = f"{verb} {first.label()}" + "".join(f" and {i.label()}" for i in rest)
    said = "; ".join(f"`{u.where}`" for u in dict((u.where, u) for u in arm.uses).values())
    made = f" (replacing {arm.widens[first].name}, which it extends)" if first in arm.widens else ""
    joins = (
        f" It also creates {_and([i.label() for i in rest])}, so that from {first.table} the plan reaches the "
        f"tables it joins by a seek: an index on the filter alone can make SQLite start at {first.table} and then "
        "scan a joined table once for every row it finds, far slower than no index at all."
        if rest
        else ""
    )
    free = f" Indexes are built before the timed executions, so building them costs nothing in {metric}."
    if first not in arm.creates:
        title = f"Add an index on {_and([i.label() for i in rest])}"
        body = (
            f"The query filters {first.table} on {_and(first.columns)} ({said}), and {asset} has an index for "
            f"that, but from {first.table} the plan reaches the tables it joins only by scanning them, once for "
            f"every row it finds. An index on {_and([i.label() for i in rest])} lets it seek instead."
        )
    elif arm.kind in ("start", "start single"):
        body = (
            f"The query filters {first.table} on {_and(first.columns)} ({said}), and no index of {asset} leads with "
            f"{'them' if len(first.columns) > 1 else 'it'}, so SQLite reads rows it then throws away. An index on "
            f"{first.label()}{made}{' (equality columns first, then the range)' if len(first.columns) > 1 else ''} "
            f"lets the plan start there and seek straight to the rows that pass.{joins}"
        )
    elif arm.kind == "cover":
        body = (
            f"The query filters {first.table} on {_and(first.columns[:-1])} and joins it on "
            f"{first.columns[-1]} ({said}). An index on {first.label()}{made} finds the rows that pass and carries "
            f"the join's key with them, so the plan need not visit {first.table} itself for it.{joins}"
        )
    elif arm.kind == "sort":
        body = (
            f"The query filters {first.table} on {_and(first.columns[:-1])} and groups or orders by "
            f"{first.columns[-1]} ({said}). In an index on {first.label()}{made} the rows that pass lie in that "
            f"order already, so the plan can skip a sort.{joins}"
        )
    elif arm.kind == "join":
        body = (
            f"The query joins {first.table} on {first.columns[0]} ({said}), and no index of {asset} leads with "
            f"that column, so SQLite may scan {first.table} where it could seek. An index on {first.label()} "
            "lets the plan look the rows up instead."
        )
    else:
        body = (
            f"The query filters on {first.columns[0]} of {first.table} ({said}), a value it computes for every "
            f"row in a subquery. As the query is written no index can find rows by that value, so {first.label()} "
            "helps only where SQLite can use it anyway; it is a cheap try after the likelier indexes (the explorer "
            "never rewrites the query: a join on the table would let such an index serve)."
        )
    return title, body + free
