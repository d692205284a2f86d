"""The checks every proposal passes before it is pushed: small enough, new (comments and layout do
not make an experiment), and per task: train.py compiles and keeps the harness, router.py compiles
and keeps the functions the evaluator calls, query.sql is index statements and one query."""

from __future__ import annotations

from pathlib import Path

from bot.core import validation

ROOT = Path(__file__).resolve().parents[3]
MAIN = (ROOT / "train.py").read_text()
CHANGED = MAIN.replace("WARMDOWN_RATIO = 0.5", "WARMDOWN_RATIO = 0.4")


def problem(text: str, earlier: list[tuple[int, str, str]] | None = None, **kw) -> str | None:
    return validation.problem("a title", text, main_asset=MAIN, earlier=earlier or [], **kw)


def test_a_real_change_passes() -> None:
    assert "WARMDOWN_RATIO = 0.4" in CHANGED and problem(CHANGED) is None


def test_a_change_to_comments_or_layout_alone_is_main() -> None:
    assert "identical to main" in problem(MAIN + "\n# a new comment\n\n")
    assert "identical to main" in problem(MAIN.replace("WARMDOWN_RATIO = 0.5", "WARMDOWN_RATIO  =  0.5"))


def test_an_earlier_experiment_is_recognised_through_its_comments() -> None:
    earlier = [(7, "lower warmdown", validation.normal_hash(CHANGED))]
    assert (
        problem(CHANGED + "# reworded\n", earlier)
        == "it repeats experiment 7 ('lower warmdown') up to comments and layout"
    )


def test_dropping_the_harness_is_refused() -> None:
    without = CHANGED.replace("h = harness.session()", "h = None")
    assert "no longer uses the harness" in problem(without)
    assert "no longer uses the harness" in problem(CHANGED.replace("from runner import harness", "import harness"))


def test_syntax_errors_sizes_and_titles() -> None:
    assert problem(CHANGED + "\ndef broken(:\n").startswith("train.py does not compile")
    assert "more than the limit" in problem(CHANGED, max_bytes=1000)
    assert validation.problem(" ", CHANGED, main_asset=MAIN, earlier=[]) == "it has no title"
    assert problem(CHANGED + "\x00").startswith("train.py does not compile")


# --- other tasks' assets -------------------------------------------------------------------------

ROUTER = (ROOT / "runner" / "tasks" / "ticket_routing" / "router.py").read_text()
QUERY = """\
-- the indexes this query may use
CREATE INDEX idx_orders_customer ON orders(customer_id);

SELECT c.id, c.name, (SELECT COUNT(*) FROM orders o WHERE o.customer_id = c.id) AS orders
FROM customers c
WHERE c.region = :region AND c.name <> 'a; b'
ORDER BY c.id;
"""


def task_problem(task: str, text: str, main: str) -> str | None:
    return validation.problem("a title", text, main_asset=main, earlier=[], task=task)


def test_a_small_change_of_the_routers_knobs_passes() -> None:
    assert task_problem("ticket-routing", ROUTER.replace("ALPHA = 1.0", "ALPHA = 0.5"), ROUTER) is None


def test_a_router_that_does_not_compile_or_loses_route_is_refused_by_name() -> None:
    broken = task_problem("ticket-routing", ROUTER + "\ndef broken(:\n", ROUTER)
    assert broken.startswith("router.py does not compile")
    renamed = ROUTER.replace("def route(", "def send(")
    assert task_problem("ticket-routing", renamed, ROUTER).startswith(
        "router.py no longer defines route() at module level: the evaluator calls train() and route()"
    )


def test_a_router_needs_no_harness_and_its_comments_are_not_an_experiment() -> None:
    assert "runner import harness" not in ROUTER
    assert "identical to main" in task_problem("ticket-routing", ROUTER + "\n# a note\n", ROUTER)


def test_a_query_with_one_more_index_passes() -> None:
    more = QUERY.replace("\n\nSELECT", "\nCREATE INDEX idx_customers_region ON customers(region);\nANALYZE;\n\nSELECT")
    assert task_problem("query-latency", more, QUERY) is None


def test_a_query_changed_only_in_comments_case_or_layout_is_main() -> None:
    relaid = "/* reworded */ create index idx_orders_customer on orders ( customer_id ) ;\n" + QUERY.split(";\n", 1)[1]
    relaid = relaid.replace("FROM customers c\nWHERE", "from customers c where")
    assert (
        task_problem("query-latency", relaid, QUERY) == "query.sql is identical to main's (up to comments and layout)"
    )
    # a string literal is data, not layout: its case makes another query
    assert task_problem("query-latency", QUERY.replace("'a; b'", "'A; b'"), QUERY) is None


def test_a_query_sql_with_two_queries_none_or_another_statement_is_refused() -> None:
    two = QUERY + "SELECT 1;\n"
    assert task_problem("query-latency", two, QUERY).startswith("query.sql holds 2 queries")
    none = "CREATE INDEX idx_a ON orders(customer_id);\n-- SELECT 1;\n"
    assert task_problem("query-latency", none, QUERY).startswith("query.sql holds no query")
    drop = "DROP TABLE orders;\n" + QUERY
    assert task_problem("query-latency", drop, QUERY) == (
        "query.sql changes the schema beyond creating indexes: DROP TABLE orders;"
    )  # the evaluator's own words (runner.tasks.query_latency.asset), as the run would be refused
    late = QUERY + "CREATE INDEX idx_b ON customers(region);\n"
    assert "CREATE INDEX and ANALYZE statements come before it" in task_problem("query-latency", late, QUERY)


def test_a_semicolon_in_a_string_or_a_comment_does_not_split_a_statement() -> None:
    assert validation.sql_statements("SELECT ';' -- x; y\n, 2 /* ; */ ;  ;") == ["select ';' , 2"]
