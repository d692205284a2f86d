"""Reading a query for the base-table columns it filters, joins, groups or orders on (no database)."""

from __future__ import annotations

from bot.agent.sql_columns import query_uses, read_schema
from runner.tasks.query_latency import PROGRAM, REFERENCE, STARTER

SCHEMA = """
CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT, region TEXT NOT NULL);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers (id),
    ordered_at TEXT NOT NULL,
    status TEXT NOT NULL
);
CREATE TABLE order_items (id INTEGER PRIMARY KEY, order_id INTEGER, product_id INTEGER, quantity INTEGER);
"""


def found(query: str, schema: str = SCHEMA) -> set[tuple[str, str, str]]:
    return {(u.table, u.column, u.kind) for u in query_uses(query, schema)}


def test_the_starter_s_cte_columns_lead_back_to_their_tables_and_computed_ones_are_marked() -> None:
    uses = {(u.table, u.column, u.kind): u for u in query_uses(STARTER.read_text(), PROGRAM.read_text())}
    assert set(uses) == {
        ("orders", "status", "equal"),  # `status = 'delivered'` on the CTE's o.status
        ("orders", "ordered_at", "range"),
        ("customers", "region", "equal"),  # region: a correlated subquery over customers
        ("products", "category", "equal"),
        ("orders", "id", "join"),
        ("order_items", "order_id", "join"),
        ("customers", "id", "join"),  # c.id = o.customer_id, o from the enclosing scope
        ("orders", "customer_id", "join"),
        ("products", "id", "join"),
        ("order_items", "product_id", "join"),  # also `p.id = product_id` in the select list's subquery
        ("order_items", "product_id", "order"),  # GROUP BY product_id
    }
    assert uses["orders", "status", "equal"].where == "status = 'delivered'"
    assert not uses["orders", "status", "equal"].through_subquery
    assert uses["customers", "region", "equal"].through_subquery  # no index finds rows by a per-row value
    assert uses["products", "category", "equal"].through_subquery
    assert uses["order_items", "order_id", "join"].partner == ("orders", "id")
    # every name in the starter is qualified or has one source: the schema is not needed
    assert found(STARTER.read_text(), "") == set(uses)


def test_the_reference_s_filters_are_on_its_joined_tables_directly() -> None:
    uses = query_uses(REFERENCE.read_text(), PROGRAM.read_text())
    filters = {(u.table, u.column, u.kind) for u in uses if u.kind != "join"}
    assert filters == {
        ("customers", "region", "equal"),
        ("products", "category", "equal"),
        ("orders", "status", "equal"),
        ("orders", "ordered_at", "range"),
        ("products", "id", "order"),  # the first term of GROUP BY p.id, p.name and of ORDER BY ..., p.id
    }
    assert not any(u.through_subquery for u in uses)


def test_a_bare_column_needs_the_schema_when_two_tables_could_own_it() -> None:
    query = """SELECT c.name FROM customers c JOIN orders o ON o.customer_id = c.id
               WHERE region = :region AND ordered_at BETWEEN :a AND :b AND status IN ('paid', 'sent')"""
    assert found(query) == {
        ("customers", "region", "equal"),
        ("orders", "ordered_at", "range"),
        ("orders", "status", "equal"),
        ("orders", "customer_id", "join"),
        ("customers", "id", "join"),
    }
    # without a schema, only the columns the query qualifies are known: the bare ones stay unresolved
    assert found(query, "") == {("orders", "customer_id", "join"), ("customers", "id", "join")}


def test_a_derived_table_passes_its_columns_through_and_order_by_reads_output_names() -> None:
    query = """SELECT x.day FROM (SELECT o.status AS s, o.ordered_at AS day FROM orders AS o) AS x
               WHERE x.s = 'paid' ORDER BY day DESC"""
    uses = query_uses(query, SCHEMA)
    assert {(u.table, u.column, u.kind, u.through_subquery) for u in uses} == {
        ("orders", "status", "equal", False),
        ("orders", "ordered_at", "order", False),
    }


def test_a_correlated_exists_joins_and_filters_the_inner_table() -> None:
    query = """SELECT o.id FROM orders o WHERE o.status = :s
               AND EXISTS (SELECT 1 FROM order_items oi WHERE oi.order_id = o.id AND oi.quantity > 5)"""
    assert found(query) == {
        ("orders", "status", "equal"),
        ("order_items", "order_id", "join"),
        ("orders", "id", "join"),
        ("order_items", "quantity", "range"),
    }


def test_both_halves_of_a_union_and_a_parenthesised_condition_are_read() -> None:
    query = """SELECT id FROM orders WHERE (status = 'paid' AND ordered_at >= :a)
               UNION ALL SELECT id FROM customers WHERE region = :r ORDER BY 1"""
    assert found(query) == {
        ("orders", "status", "equal"),
        ("orders", "ordered_at", "range"),
        ("customers", "region", "equal"),
    }


def test_what_no_plain_index_serves_is_left_out() -> None:
    assert found("SELECT id FROM orders WHERE status <> 'x' AND customer_id NOT IN (1, 2)") == set()
    assert found("SELECT id FROM orders WHERE date(ordered_at) >= :a AND status IS NOT NULL") == set()
    assert found("SELECT id FROM orders WHERE status = 'a' OR ordered_at > :b") == set()
    assert found("SELECT id FROM orders o WHERE o.status = o.status") == set()


def test_the_schema_is_read_from_create_table_and_from_program_md_lines() -> None:
    schema, keys = read_schema(SCHEMA)
    assert schema["orders"] == {"id", "customer_id", "ordered_at", "status"}  # REFERENCES customers (id) is no column
    assert keys == {"customers": "id", "orders": "id", "order_items": "id"}
    schema, keys = read_schema(PROGRAM.read_text())
    assert schema["order_items"] == {"id", "order_id", "product_id", "quantity", "unit_price_cents"}
    assert keys["products"] == "id"
    assert read_schema("no sql here (a, b)") == ({}, {})


def test_a_query_nested_too_deep_to_read_yields_nothing_rather_than_an_error() -> None:
    assert found("SELECT " + "(SELECT " * 2000 + "1" + ")" * 2000) == set()
