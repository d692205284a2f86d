"""Which base-table columns a SQL query filters, joins, groups or orders on, read from its text alone.

The offline explorer (bot.agent.indexes) proposes indexes without a database connection, so it
reads the query the way a person skimming it would, and stops where that stops:

* The query is split into its tokens (bot.core.validation's normal form: comments gone, lower case
  outside string literals) and its parentheses into groups. Every `SELECT` is a scope: its sources
  (`FROM`/`JOIN table [AS] alias`, a parenthesised subquery with an alias, a common table
  expression by name), its output columns (`expr [AS] name`), its predicates (`WHERE`, `ON`,
  `HAVING`, each split at its top-level `AND`) and the first term of its `GROUP BY` and of its
  `ORDER BY` (the one an index can hand rows over in the order of, after its equality columns). A subquery
  anywhere else (in the select list, in a predicate) is a scope whose parent is the one it sits
  in, so a correlated reference (`o.customer_id` in `(SELECT c.region FROM customers AS c WHERE
  c.id = o.customer_id)`) is found in the scope that names `o`.
* `q.col` is looked up by its qualifier from the innermost scope outwards; a bare `col` in the
  scope one of whose sources has it (by the declared schema, else by the columns the query itself
  names qualified; a lone source of unknown columns takes it), then outwards, and in an
  `ORDER BY` also among the output names. A table ends the search. A CTE or a derived table goes on
  through its output column: a plain column reference is followed (SQLite pushes a filter down
  through it, so an index of that table can serve it); a scalar subquery
  `(SELECT p.category FROM products AS p WHERE ...) AS category` is followed to its one column but
  marked `through_subquery`, since the query computes that value per row and no index of products
  can find rows by it; anything else (an aggregate, arithmetic) is a computed value and no column.
* A predicate `column op value` (a value: a parameter, a literal, NULL, an expression of those or
  an uncorrelated subquery) is a filter: `equal` for `=`, `==`, `IS`, `IN (...)`; `range` for `<`,
  `<=`, `>`, `>=`, `BETWEEN`, `LIKE`, `GLOB`. `column = column` of two columns is a join.

What it leaves out: `<>`, `!=`, `NOT ...`, `IS NOT`, a column inside a function
(`date(o.ordered_at) >= :start`), conditions joined by a top-level `OR`, joins through `USING
(...)` or `NATURAL JOIN`, and everything only a database knows: the plan SQLite will choose, the
tables' sizes and how selective a filter is (bot.agent.indexes' priors stand in for them, and the
judge's measurements correct the priors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from bot.core.validation import sql_statements

_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|[\w$:@?]+|<>|<=|>=|!=|==|\|\||\S")
_IDENT = re.compile(r"[a-z_][a-z0-9_]*")
_VALUE = re.compile(r"'(?:[^']|'')*'|[:@$?][a-z0-9_]*|\d+(?:\.\d+)?(?:e[+-]?\d+)?|null|true|false|current_\w+")
_CLAUSES = {"from", "where", "group", "having", "order", "limit", "window"}
_COMPOUND = {"union", "intersect", "except"}
_JOIN_WORDS = {"join", "left", "right", "inner", "outer", "cross", "natural", "full"}
_KEYWORDS = _CLAUSES | _COMPOUND | _JOIN_WORDS | {
    "select", "distinct", "all", "as", "on", "using", "and", "or", "not", "is", "null", "in", "like", "between",
    "exists", "case", "when", "then", "else", "end", "by", "asc", "desc", "with", "recursive", "materialized",
    "escape", "glob", "collate", "offset", "nulls", "indexed", "values",
}  # fmt: skip
_EQUAL_OPS = {"=", "==", "is", "in"}
_RANGE_OPS = {"<", "<=", ">", ">=", "between", "like", "glob"}
_NOT_SERVED = {"<>", "!="}  # comparisons no plain index serves


class Group(list):  # type: ignore[type-arg]
    """The items between a pair of parentheses: tokens (str) and nested Groups."""


Item = str | Group


@dataclass(frozen=True)
class Use:
    """One base-table column the query filters, joins, groups or orders on."""

    table: str
    column: str
    kind: str  # "equal", "range", "join" or "order"
    where: str  # the predicate or term it was found in, normalised (`o.status = ''`)
    through_subquery: bool = False  # its value is a scalar subquery's, computed per row: no index finds rows by it
    partner: tuple[str, str] | None = None  # a join's other side: (table, column)


@dataclass
class Scope:
    """One SELECT: what the names inside it refer to."""

    parent: Scope | None
    ctes: dict[str, Scope]
    sources: dict[str, str | Scope] = field(default_factory=dict)  # alias -> a table's name, or a CTE / derived table
    outputs: dict[str, list[Item]] = field(default_factory=dict)  # output column's name -> its expression
    stars: list[str | None] = field(default_factory=list)  # `*` (None) or `alias.*` in the select list


@dataclass(frozen=True)
class Origin:
    table: str
    column: str
    through_subquery: bool = False


def read_schema(text: str) -> tuple[dict[str, set[str]], dict[str, str]]:
    """The tables and columns a text declares, and each table's INTEGER PRIMARY KEY: its `CREATE
    TABLE` statements and, inside a fenced sql block (as in a program.md), lines of the form
    `table (col TYPE, col, ...)`."""
    pieces = re.findall(r"(?is)\bcreate\s+table\s+(?:if\s+not\s+exists\s+)?[\w\"]+\s*\(.*?\)\s*;", text)
    for block in re.findall(r"(?s)```sql\s*\n(.*?)```", text):
        pieces += re.findall(r"(?m)^[ \t]*[A-Za-z_]\w*[ \t]*\(.*\)[ \t]*;?[ \t]*$", block)
    schema: dict[str, set[str]] = {}
    keys: dict[str, str] = {}
    for piece in pieces:
        items = _group(_tokens(" ".join(sql_statements(piece))))
        at = next((k for k, it in enumerate(items) if isinstance(it, Group)), None)
        table = _word(items, at - 1) if at else ""
        if at is None or not table:
            continue
        for part in _split(list(items[at]), {","}):
            name = _word(part, 0)
            if not name or _is(part, 0, "primary", "foreign", "unique", "check", "constraint"):
                continue
            schema.setdefault(table, set()).add(name)
            if part[1:4] == ["integer", "primary", "key"]:
                keys[table] = name
    return schema, keys


def query_uses(query: str, schema_text: str = "") -> list[Use]:
    """The base-table columns the query filters, joins, groups or orders on (module docstring),
    each (table, column, kind) once, in the order they are read (a scope's own before its
    subqueries'); schema_text (a program.md, CREATE TABLE statements) says which table a bare
    column belongs to where the query does not; nothing for a query nested too deep to read."""
    schema, _ = read_schema(schema_text)
    try:
        return Reader(schema).read(query)
    except RecursionError:  # hundreds of nested parentheses: SQLite's own depth limit is near
        return []


class Reader:
    """One query's scopes, then what its predicates and terms say of the tables' columns."""

    def __init__(self, schema: dict[str, set[str]] | None = None):
        self.schema = {table: set(columns) for table, columns in (schema or {}).items()}
        self.scopes: list[Scope] = []
        self.subqueries: dict[int, Scope] = {}  # id of a subquery's Group -> its scope
        self.terms: list[tuple[Scope, str, list[Item]]] = []  # (scope, "predicate" or "order", its items)
        self._resolving: set[tuple[int, str]] = set()

    def read(self, query: str) -> list[Use]:
        statements = sql_statements(query)
        self._query(_group(_tokens(statements[-1] if statements else "")), None, {})
        for scope in self.scopes:
            for expr in scope.outputs.values():
                self._learn_qualified(scope, expr)
        for scope, _, term in self.terms:
            self._learn_qualified(scope, term)
        uses: dict[tuple[str, str, str], Use] = {}
        for scope, what, term in self.terms:
            for use in self._predicate(scope, term) if what == "predicate" else self._order(scope, term):
                uses.setdefault((use.table, use.column, use.kind), use)
        return list(uses.values())

    # --- the query's scopes ----------------------------------------------------------------------
    def _query(self, items: list[Item], parent: Scope | None, ctes: dict[str, Scope]) -> Scope | None:
        """A whole query (`WITH ...`, SELECTs joined by UNION and the like, `ORDER BY`): the scope of
        its first SELECT, whose output names are the query's."""
        i, ctes = 0, dict(ctes)
        if _is(items, 0, "with"):
            i = 2 if _is(items, 1, "recursive") else 1
            while i < len(items):
                name = _word(items, i)
                i += 2 if isinstance(_at(items, i + 1), Group) else 1  # a column list: the body's names are used
                while _is(items, i, "as", "not", "materialized"):
                    i += 1
                body = _at(items, i)
                if name and isinstance(body, Group):
                    scope = self._query(list(body), parent, ctes)
                    if scope is not None:
                        ctes[name] = scope
                i += 1
                if not _is(items, i, ","):
                    break
                i += 1
        cores = _split(items[i:], _COMPOUND)
        scopes = [self._select(core, parent, ctes) for core in cores]
        last = scopes[-1] if scopes else None
        order = _clauses(cores[-1]).get("order", []) if cores else []
        terms = _split(order[2:] if _is(order, 1, "by") else [], {","})
        if last is not None and terms:
            self.terms.append((last, "order", terms[0]))
        return scopes[0] if scopes else None

    def _select(self, items: list[Item], parent: Scope | None, ctes: dict[str, Scope]) -> Scope | None:
        """One `SELECT ... FROM ... WHERE ... GROUP BY ... HAVING ...`."""
        start = next((k for k, it in enumerate(items) if it == "select"), None)
        if start is None:
            return None
        scope = Scope(parent, ctes)
        self.scopes.append(scope)
        clauses = _clauses(items[start:])
        for source in _split(clauses.get("from", [])[1:], {","} | _JOIN_WORDS):
            self._source(scope, source)
        for item in _split(clauses.get("select", [])[1:], {","}):
            self._output(scope, item[1:] if _is(item, 0, "distinct", "all") else item)
        for name in ("where", "having"):
            for term in _conjuncts(clauses.get(name, [])[1:]):
                self.terms.append((scope, "predicate", term))
        group = clauses.get("group", [])
        terms = _split(group[2:] if _is(group, 1, "by") else [], {","})
        if terms:
            self.terms.append((scope, "order", terms[0]))
        self._nested(scope, items[start:])
        return scope

    def _source(self, scope: Scope, items: list[Item]) -> None:
        """One FROM item, `table [AS] alias` or `(subquery) [AS] alias` or a CTE's name, and its ON."""
        on = next((k for k, it in enumerate(items) if it in ("on", "using")), len(items))
        head = [it for it in items[:on] if it not in ("as", "indexed", "by", "not")]
        if head and isinstance(head[0], Group):
            derived = self._query(list(head[0]), scope.parent, scope.ctes)
            if derived is not None:
                self.subqueries[id(head[0])] = derived
                if _word(head, 1):
                    scope.sources[_word(head, 1)] = derived
        elif _word(head, 0):
            if _is(head, 1, ".") and _word(head, 2):  # schema.table
                head = head[2:]
            name = _word(head, 0)
            target = scope.ctes.get(name) or name
            scope.sources[_word(head, 1) or name] = target
            if isinstance(target, str):
                self.schema.setdefault(target, set())
        if _is(items, on, "on"):
            for term in _conjuncts(items[on + 1 :]):
                self.terms.append((scope, "predicate", term))

    def _output(self, scope: Scope, items: list[Item]) -> None:
        if items == ["*"]:
            scope.stars.append(None)
        elif len(items) == 3 and items[1:] == [".", "*"]:
            scope.stars.append(_word(items, 0))
        elif len(items) >= 3 and _is(items, -2, "as") and _word(items, -1):
            scope.outputs.setdefault(_word(items, -1), items[:-2])
        elif len(items) >= 2 and _word(items, -1) and not _is(items, -2, ".") and _expression_ends(items[-2]):
            scope.outputs.setdefault(_word(items, -1), items[:-1])  # `expr alias`
        elif _word(items, -1):
            scope.outputs.setdefault(_word(items, -1), items)  # `col` or `alias.col`: named after the column

    def _nested(self, scope: Scope, items: list[Item]) -> None:
        """The scopes of the subqueries in a SELECT's list, predicates and terms (FROM's are read)."""
        for it in items:
            if not isinstance(it, Group) or id(it) in self.subqueries:
                continue
            if _is(it, 0, "select", "with"):
                sub = self._query(list(it), scope, scope.ctes)
                if sub is not None:
                    self.subqueries[id(it)] = sub
            else:
                self._nested(scope, list(it))

    def _learn_qualified(self, scope: Scope, items: list[Item]) -> None:
        """A column the query names qualified (`p.category`, p a table) is a column of that table."""
        for k, it in enumerate(items):
            if isinstance(it, Group):
                if id(it) not in self.subqueries:
                    self._learn_qualified(scope, list(it))
            elif it == "." and _word(items, k - 1) and _word(items, k + 1) and k > 0:
                found = _source_named(scope, _word(items, k - 1))
                if isinstance(found, str):
                    self.schema.setdefault(found, set()).add(_word(items, k + 1))

    # --- resolving names -----------------------------------------------------------------------
    def _column(self, scope: Scope, items: list[Item]) -> Origin | None:
        """The table column an operand is, followed through CTEs, derived tables and scalar
        subqueries; None for anything else."""
        if len(items) == 1 and isinstance(items[0], Group):
            sub = self.subqueries.get(id(items[0]))
            if sub is None:
                return self._column(scope, list(items[0]))  # `(o.status)`
            if len(sub.outputs) != 1 or sub.stars:
                return None
            inner = self._column(sub, next(iter(sub.outputs.values())))
            return None if inner is None else Origin(inner.table, inner.column, True)
        if len(items) == 3 and _is(items, 1, ".") and _word(items, 0) and _word(items, 2):
            return self._named(scope, _word(items, 0), _word(items, 2))
        if len(items) == 1 and _word(items, 0) and not _VALUE.fullmatch(_word(items, 0)):
            return self._named(scope, None, _word(items, 0))
        return None

    def _named(self, scope: Scope | None, qualifier: str | None, column: str, outputs: bool = False) -> Origin | None:
        while scope is not None:
            if qualifier is not None:
                if qualifier in scope.sources:
                    return self._in_source(scope.sources[qualifier], column)
            else:
                having = [s for s in scope.sources.values() if self._has(s, column)]
                unknown = [s for s in scope.sources.values() if isinstance(s, str) and not self.schema.get(s)]
                if not having and len(scope.sources) == 1 and unknown:
                    having = unknown
                if len(having) > 1:
                    return None  # ambiguous: SQLite refuses it too
                if having:
                    return self._in_source(having[0], column)
                if outputs and scope.outputs.get(column, [column]) != [column]:
                    return self._guarded(scope, column, scope.outputs[column])  # ORDER BY an output's name
            scope, outputs = scope.parent, False
        return None

    def _has(self, source: str | Scope, column: str) -> bool:
        if isinstance(source, str):
            return column in self.schema.get(source, ()) or column == "rowid"
        if column in source.outputs:
            return True
        for star in source.stars:
            targets = list(source.sources.values()) if star is None else [source.sources.get(star, "")]
            if any(t and self._has(t, column) for t in targets):
                return True
        return False

    def _in_source(self, source: str | Scope, column: str) -> Origin | None:
        if isinstance(source, str):
            return Origin(source, column)
        if column in source.outputs:
            return self._guarded(source, column, source.outputs[column])
        star = [s for s in source.sources.values() if self._has(s, column)] if source.stars else []
        return self._in_source(star[0], column) if len(star) == 1 else None

    def _guarded(self, scope: Scope, column: str, expr: list[Item]) -> Origin | None:
        """An output column's origin; None where names refer to each other in a circle."""
        key = (id(scope), column)
        if key in self._resolving:
            return None
        self._resolving.add(key)
        try:
            return self._column(scope, expr)
        finally:
            self._resolving.discard(key)

    # --- what a predicate or a term says -------------------------------------------------------
    def _predicate(self, scope: Scope, items: list[Item]) -> list[Use]:
        ops = _EQUAL_OPS | _RANGE_OPS | _NOT_SERVED
        at = next((k for k, it in enumerate(items) if isinstance(it, str) and it in ops), None)
        if not at or items[at] in _NOT_SERVED or _is(items, at - 1, "not") or _is(items, at + 1, "not"):
            return []
        op, left, right = items[at], items[:at], items[at + 1 :]
        if op == "between":
            right = right[: next((k for k, it in enumerate(right) if it == "and"), len(right))]
        if op in ("like", "glob"):
            right = right[: next((k for k, it in enumerate(right) if it == "escape"), len(right))]
        a = self._column(scope, left)
        b = self._column(scope, right) if op != "in" else None
        where = _text(items)
        if a is not None and b is not None:
            if op != "=" and op != "==" or (a.table, a.column) == (b.table, b.column):
                return []
            if a.through_subquery or b.through_subquery:
                return []
            return [
                Use(a.table, a.column, "join", where, partner=(b.table, b.column)),
                Use(b.table, b.column, "join", where, partner=(a.table, a.column)),
            ]
        kind = "equal" if op in _EQUAL_OPS else "range"
        return [
            Use(side.table, side.column, kind, where, side.through_subquery)
            for side, other in ((a, right), (b, left))
            if side is not None and _value(other, self.subqueries)
        ]

    def _order(self, scope: Scope, items: list[Item]) -> list[Use]:
        cut = next((k for k, it in enumerate(items) if it in ("asc", "desc", "nulls", "collate")), len(items))
        origin = self._named(scope, None, _word(items, 0), outputs=True) if cut == 1 and _word(items, 0) else None
        origin = origin or self._column(scope, items[:cut])
        if origin is None or origin.through_subquery:
            return []
        return [Use(origin.table, origin.column, "order", _text(items))]


# --- tokens and groups --------------------------------------------------------------------------
def _tokens(text: str) -> list[str]:
    out = []
    for tok in _TOKEN.findall(text):
        if tok.startswith('"'):
            out.append(tok[1:-1].replace('""', '"').lower())  # a quoted identifier
        else:
            out.append(tok)
    return out


def _group(tokens: list[str]) -> list[Item]:
    stack: list[list[Item]] = [[]]
    for tok in tokens:
        if tok == "(":
            stack.append(Group())
        elif tok == ")" and len(stack) > 1:
            inner = stack.pop()
            stack[-1].append(inner)  # type: ignore[arg-type]
        else:
            stack[-1].append(tok)
    while len(stack) > 1:  # an unclosed parenthesis closes at the end
        inner = stack.pop()
        stack[-1].append(inner)  # type: ignore[arg-type]
    return stack[0]


def _at(items: list[Item], k: int) -> Item | None:
    return items[k] if -len(items) <= k < len(items) else None


def _is(items: list[Item], k: int, *words: str) -> bool:
    return _at(items, k) in words


def _word(items: list[Item], k: int) -> str:
    """The identifier at position k (not a keyword), or ''."""
    it = _at(items, k)
    return it if isinstance(it, str) and _IDENT.fullmatch(it) and it not in _KEYWORDS else ""


def _expression_ends(item: Item) -> bool:
    """Whether an item can end an expression, so that a name after it is the output's alias."""
    return isinstance(item, Group) or bool(_IDENT.fullmatch(item) or _VALUE.fullmatch(item)) or item == "*"


def _split(items: list[Item], at: set[str]) -> list[list[Item]]:
    parts: list[list[Item]] = [[]]
    for it in items:
        if isinstance(it, str) and it in at:
            parts.append([])
        else:
            parts[-1].append(it)
    return [p for p in parts if p]


def _clauses(items: list[Item]) -> dict[str, list[Item]]:
    """A SELECT's clauses by their first word (select, from, where, group, having, order, limit)."""
    clauses: dict[str, list[Item]] = {}
    current = "select"
    for it in items:
        if isinstance(it, str) and it in _CLAUSES:
            current = it
        clauses.setdefault(current, []).append(it)
    return clauses


def _conjuncts(items: list[Item]) -> list[list[Item]]:
    """A condition's terms joined by top-level ANDs (a BETWEEN keeps its own), a parenthesised
    condition opened; none where a top-level OR joins them."""
    if "or" in items:
        return []
    terms: list[list[Item]] = [[]]
    between = False
    for it in items:
        if it == "and" and not between:
            terms.append([])
            continue
        between = it == "between" or (between and it != "and")
        terms[-1].append(it)
    out: list[list[Item]] = []
    for term in terms:
        if len(term) == 1 and isinstance(term[0], Group) and not _is(term[0], 0, "select", "with"):
            out.extend(_conjuncts(list(term[0])))
        elif term:
            out.append(term)
    return out


def _value(items: list[Item], subqueries: dict[int, Scope]) -> bool:
    """Whether an operand is known before a row is read: parameters, literals, functions of them,
    a subquery (taken for uncorrelated)."""
    for k, it in enumerate(items):
        if isinstance(it, Group):
            if id(it) not in subqueries and it and not _value(list(it), subqueries):
                return False
        elif _IDENT.fullmatch(it) and it not in _KEYWORDS and not _VALUE.fullmatch(it):
            if not isinstance(_at(items, k + 1), Group):  # a name not called as a function: a column
                return False
    return bool(items)


def _source_named(scope: Scope | None, alias: str) -> str | Scope | None:
    while scope is not None:
        if alias in scope.sources:
            return scope.sources[alias]
        scope = scope.parent
    return None


def _text(items: list[Item]) -> str:
    text = " ".join(f"({_text(list(it))})" if isinstance(it, Group) else it for it in items)
    return text.replace(" . ", ".").replace(" ,", ",")
