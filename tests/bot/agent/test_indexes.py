"""The offline explorer on query.sql: index edits found from the query's text, chosen by a bandit."""

from __future__ import annotations

import pytest

from bot.agent.explorer import OfflineExplorer
from bot.agent.indexes import arms, statements
from bot.core import validation
from bot.core.protocols import AgentStopped
from bot.core.records import HistoryEntry, Proposal, ProposalContext, code_hash
from runner.tasks.query_latency import PROGRAM, REFERENCE, STARTER

QUERY_SQL = """\
-- revenue per customer of a region
CREATE INDEX idx_customers_region ON customers (region);

SELECT c.id, c.name,
       (SELECT SUM(oi.quantity) FROM orders o JOIN order_items oi ON oi.order_id = o.id
         WHERE o.customer_id = c.id AND o.ordered_at >= :start) AS units
FROM customers c
WHERE c.region = :region
ORDER BY units DESC;
"""
START = "add orders(status, ordered_at) + order_items(order_id)"


def ctx_for(asset: str, history: list[HistoryEntry] | None = None, program_md: str = "") -> ProposalContext:
    return ProposalContext(
        program_md=program_md or PROGRAM.read_text(),
        asset=asset,
        main_val_bpb=100.0,
        history=list(history or []),
        seen_hashes={code_hash(asset)},
        profile="smoke",
        task="query-latency",
    )


def entry(i: int, p: Proposal, status: str, delta: float | None) -> HistoryEntry:
    return HistoryEntry(
        id=i,
        title=p.title,
        hypothesis="",
        status=status,
        val_bpb=None if delta is None else 100.0 + delta,
        delta=delta,
        code_hash=code_hash(p.asset),
        meta=p.meta,
    )


def run_loop(ctx: ProposalContext, n: int, seed: int = 0, status: str = "discard") -> list[Proposal]:
    """Propose n times, feeding each proposal back as a finished experiment that did not change p95_ms."""
    out = []
    for _ in range(n):
        p = OfflineExplorer(seed).propose(ctx)
        out.append(p)
        ctx.seen_hashes.add(code_hash(p.asset))
        ctx.history.append(entry(len(ctx.history) + 1, p, status, 0.0))
    return out


def ranked(asset: str, program_md: str = "") -> list[tuple[str, str]]:
    spans = statements(asset)
    query = asset[spans[-1].start : spans[-1].end]
    found = arms(query, spans[:-1], program_md or PROGRAM.read_text())
    return [(a.kind, a.key) for a in sorted(found, key=lambda a: (-a.score, a.key))]


def test_on_the_starter_the_first_edit_indexes_the_filters_of_orders_with_the_join_it_needs() -> None:
    starter = STARTER.read_text()
    p = OfflineExplorer(seed=0).propose(ctx_for(starter))
    assert p.title == "Add an index on orders(status, ordered_at) and order_items(order_id)"
    statements_ = (
        "CREATE INDEX idx_orders_status_ordered_at ON orders (status, ordered_at);\n"
        "CREATE INDEX idx_order_items_order_id ON order_items (order_id);\n\n"
    )
    assert p.asset == starter.replace("WITH item_facts AS (", statements_ + "WITH item_facts AS (", 1)
    assert "filters orders on status and ordered_at (`status = 'delivered'`; `ordered_at >= :start`)" in p.hypothesis
    assert "It also creates order_items(order_id)" in p.hypothesis and "any difference in p95_ms" in p.hypothesis
    assert p.meta["changes"] == [
        {
            "name": "indexes",
            "index": START,
            "kind": "start",
            "old": "none",
            "new": "orders(status, ordered_at), order_items(order_id)",
            "creates": ["orders(status, ordered_at)", "order_items(order_id)"],
        }
    ]
    assert validation.problem("t", p.asset, main_asset=starter, earlier=[], task="query-latency") is None
    assert [OfflineExplorer(seed).propose(ctx_for(starter)).title for seed in range(6)] == [p.title] * 6


def test_a_filter_index_on_orders_never_comes_without_the_index_its_join_needs() -> None:
    # orders(status, ordered_at) alone makes SQLite start at orders and scan order_items once per order
    found = ranked(STARTER.read_text())
    for kind, key in found:
        if key.startswith("add orders(") and kind != "join":
            assert key.endswith(" + order_items(order_id)"), key
    assert found[0] == ("start", START)
    kinds = [kind for kind, _ in found]
    # the filters the starter computes in subqueries (region, category) come last among the additions
    assert kinds.index("subquery filter") > max(k for k, kind in enumerate(kinds) if kind == "join")
    assert ("subquery filter", "add customers(region)") in found and (
        "subquery filter",
        "add products(category)",
    ) in found


def test_on_the_reference_each_filtered_table_may_start_the_plan_with_its_joins_indexed() -> None:
    found = dict((key, kind) for kind, key in ranked(REFERENCE.read_text()))
    assert found[START] == "start"
    assert found["add customers(region) + orders(customer_id) + order_items(order_id)"] == "start"
    assert found["add products(category) + order_items(product_id)"] == "start"
    assert found["add orders(status, ordered_at, customer_id) + order_items(order_id)"] == "cover"
    assert "subquery filter" not in found.values()


def test_after_a_keep_the_explorer_widens_an_index_in_place_and_adds_analyze_after_the_indexes() -> None:
    starter = STARTER.read_text()
    first = OfflineExplorer(0).propose(ctx_for(starter))
    ctx = ctx_for(first.asset, history=[entry(1, first, "keep", -30.0)])
    widen = OfflineExplorer(0).propose(ctx)
    assert widen.title == "Widen idx_orders_status_ordered_at to orders(status, ordered_at, customer_id)"
    assert widen.asset == first.asset.replace(
        "CREATE INDEX idx_orders_status_ordered_at ON orders (status, ordered_at);",
        "CREATE INDEX idx_orders_status_ordered_at_customer_id ON orders (status, ordered_at, customer_id);",
    )
    assert widen.meta["changes"][0]["old"] == "orders(status, ordered_at)"
    ctx.seen_hashes.add(code_hash(widen.asset))
    ctx.history.append(entry(2, widen, "discard", 0.0))
    analyze = OfflineExplorer(0).propose(ctx)
    assert analyze.title == "Add ANALYZE after the indexes"
    assert analyze.asset == first.asset.replace(
        "ON order_items (order_id);\n", "ON order_items (order_id);\nANALYZE;\n"
    )
    # with ANALYZE in query.sql, a new index goes before it, so that its statistics are gathered
    with_stats = analyze.asset
    later = [p for p in run_loop(ctx_for(with_stats), 4) if "orders(customer_id)" in p.title]
    assert later and "CREATE INDEX idx_orders_customer_id ON orders (customer_id);\nANALYZE;" in later[0].asset


def test_an_index_that_leads_with_a_start_arm_s_columns_counts_as_there() -> None:
    asset = "CREATE INDEX by_day ON orders (status, ordered_at, customer_id);\n" + STARTER.read_text()
    found = ranked(asset)
    assert ("start", "add order_items(order_id)") in found  # the filter's index is there; its join's is not
    assert not any("orders(status, ordered_at)" in key for _, key in found)
    p = OfflineExplorer(0).propose(ctx_for(asset))
    assert p.title == "Add an index on order_items(order_id)"
    assert (
        "has an index for that, but from orders the plan reaches the tables it joins only by scanning" in p.hypothesis
    )


def test_an_equality_filter_and_an_order_by_on_one_table_make_a_sort_arm() -> None:
    query = "SELECT o.id FROM orders o WHERE o.status = :s ORDER BY o.ordered_at DESC LIMIT 10;"
    assert ranked(query)[:2] == [("start", "add orders(status)"), ("sort", "add orders(status, ordered_at)")]
    ctx = ctx_for(query)
    ctx.seen_hashes.add(code_hash(OfflineExplorer(0).propose(ctx).asset))
    p = OfflineExplorer(0).propose(ctx)
    assert p.title == "Add an index on orders(status, ordered_at)" and "skip a sort" in p.hypothesis


def test_a_declared_integer_primary_key_is_never_indexed_again() -> None:
    program = "```sql\nshops (shop_no INTEGER PRIMARY KEY, city)\nsales (id INTEGER PRIMARY KEY, shop, day)\n```\n"
    query = "SELECT s.day FROM sales s JOIN shops h ON h.shop_no = s.shop WHERE city = :c;"
    assert ranked(query, program) == [
        ("start", "add shops(city) + sales(shop)"),
        ("join", "add sales(shop)"),
        ("analyze without indexes", "add ANALYZE"),
    ]


def test_an_edit_that_hurt_waits_behind_untried_ones_and_those_sharing_its_index_sink_with_it() -> None:
    starter = STARTER.read_text()
    first = OfflineExplorer(0).propose(ctx_for(starter))
    ctx = ctx_for(starter, [entry(1, first, "discard", 50.0)])
    ctx.seen_hashes.add(code_hash(first.asset))
    assert [OfflineExplorer(seed).propose(ctx).title for seed in range(4)] == [
        "Add an index on orders(customer_id)"
    ] * 4
    keys = [p.meta["changes"][0]["index"] for p in run_loop(ctx, 8)]
    # the cover arm, untried but creating order_items(order_id) too, waits behind the untouched joins
    cover = "add orders(status, ordered_at, customer_id) + order_items(order_id)"
    assert keys.index(cover) > keys.index("add order_items(product_id)")
    assert ranked(starter)[1] == ("cover", cover)  # where it stood before anything was tried


def test_on_a_query_sql_with_an_index_the_explorer_also_drops_it_and_stops_when_all_were_tried() -> None:
    ctx = ctx_for(QUERY_SQL)
    proposals = run_loop(ctx, 6)
    assert [p.title for p in proposals] == [
        "Add an index on orders(customer_id) and order_items(order_id)",  # the plan starts at customers(region)
        "Add an index on orders(ordered_at) and order_items(order_id)",
        "Add an index on orders(ordered_at, customer_id) and order_items(order_id)",
        "Add an index on order_items(order_id)",  # outcomes that improved a little lift arms sharing an index
        "Add ANALYZE after the indexes",
        "Add an index on orders(customer_id)",
    ]
    dropped = run_loop(ctx, 1)[0]
    assert dropped.title == "Drop the index idx_customers_region"
    assert "CREATE INDEX" not in dropped.asset and dropped.asset.endswith(QUERY_SQL.split("\n\n", 1)[1])
    for p in [*proposals, dropped]:
        assert validation.problem("t", p.asset, main_asset=QUERY_SQL, earlier=[], task="query-latency") is None
    with pytest.raises(AgentStopped, match="explorer exhausted: every index edit of query.sql") as stopped:
        run_loop(ctx, 1)
    assert (
        "(columns the query filters or joins on: customers.region, order_items.order_id, orders.customer_id, "
        "orders.ordered_at; indexes it creates: idx_customers_region)" in str(stopped.value)
    )  # keys left out


def test_a_query_sql_that_does_not_end_with_its_query_stops_the_explorer() -> None:
    with pytest.raises(AgentStopped, match="must end with its one query"):
        OfflineExplorer(0).propose(ctx_for("CREATE INDEX i ON orders (status);\n"))
