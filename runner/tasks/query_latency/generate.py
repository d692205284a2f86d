"""Generating the query-latency task's database and workload, deterministically.

The database is SQLite (the standard library's: nothing to install, and the engine the asset is
measured on is the one every Python has; DuckDB would add a dependency and measure a columnar
engine that makes most indexes pointless). Four tables of a real shape (SCHEMA): customers
(region, segment), products (category, price), orders (customer, day, status) and order_items
(order, product, quantity, unit price). Money is in integer cents, so that a sum is exact whatever
order a plan adds the rows in. Distributions are skewed as a shop's are: a few customers place many
orders and a few products sell most (Zipf-like), regions and categories are of very different
sizes, and orders follow seasons (November and December busy, weekends busier, the shop growing).
Order ids follow time, as they do where ids are handed out in order. Rows are drawn with numpy
(PCG64, fixed seeds) and written with executemany in one transaction: about 2.9 million rows in
about 10 s on one core.

The workload is a fixed list of parameter sets for the one query (`:region`, `:category`,
`:start`, `:end`: a window of whole months, `:end` exclusive), seeded by the task, never by the
asset; each set's reference rows (reference.sql's query) define correctness.
"""

from __future__ import annotations

import datetime
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np

from runner.tasks.query_latency.asset import parse

VERSION = 1  # bump when what this module makes from the same sizes and seeds changes
REFERENCE = Path(__file__).with_name("reference.sql")
FIRST_DAY, END_DAY = datetime.date(2022, 1, 1), datetime.date(2025, 1, 1)  # three years of orders
DATA_SEED, WORKLOAD_SEED = 20240601, 19
REGIONS = ("us-east", "us-west", "eu-west", "eu-central", "uk", "apac", "latam", "africa")
SEGMENTS = ("consumer", "small_business", "enterprise")
CATEGORIES = (
    "electronics",
    "books",
    "home",
    "clothing",
    "toys",
    "grocery",
    "beauty",
    "sports",
    "garden",
    "automotive",
    "music",
    "office",
)
STATUSES = ("delivered", "shipped", "cancelled", "returned")
SCHEMA = """
CREATE TABLE customers (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    email TEXT NOT NULL,
    region TEXT NOT NULL,
    segment TEXT NOT NULL,
    signed_up TEXT NOT NULL
);
CREATE TABLE products (
    id INTEGER PRIMARY KEY,
    name TEXT NOT NULL,
    category TEXT NOT NULL,
    price_cents INTEGER NOT NULL
);
CREATE TABLE orders (
    id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customers (id),
    ordered_at TEXT NOT NULL,
    status TEXT NOT NULL
);
CREATE TABLE order_items (
    id INTEGER PRIMARY KEY,
    order_id INTEGER NOT NULL REFERENCES orders (id),
    product_id INTEGER NOT NULL REFERENCES products (id),
    quantity INTEGER NOT NULL,
    unit_price_cents INTEGER NOT NULL
);
"""


def database(path: Path, customers: int, products: int, orders: int) -> dict[str, int]:
    """Write the scale's database to `path`; return each table's row count."""
    rng = np.random.Generator(np.random.PCG64(DATA_SEED))
    days = [FIRST_DAY + datetime.timedelta(n) for n in range((END_DAY - FIRST_DAY).days)]
    day_text = [day.isoformat() for day in days]
    # seasons: November and December busy, July a little, weekends busier, a shop growing over the years
    busy = np.array(
        [
            (1.0 + 0.7 * (day.month in (11, 12)) + 0.2 * (day.month == 7))
            * (1.15 if day.weekday() >= 5 else 1.0)
            * (1.0 + n / len(days))
            for n, day in enumerate(days)
        ]
    )
    con = sqlite3.connect(path, isolation_level=None)
    try:
        con.execute("PRAGMA journal_mode = OFF")  # a file being made: renamed into place only when whole
        con.execute("PRAGMA synchronous = OFF")
        con.executescript(SCHEMA)
        con.execute("BEGIN")
        n = customers
        region = _draw(rng, _zipf(len(REGIONS), 1.0), n)
        segment = _draw(rng, np.array([0.72, 0.2, 0.08]), n)
        signed_up = _draw(rng, np.ones(len(days)), n)
        con.executemany(
            "INSERT INTO customers VALUES (?, ?, ?, ?, ?, ?)",
            (
                (i, f"Customer {i}", f"customer{i}@example.com", REGIONS[r], SEGMENTS[s], day_text[d])
                for i, r, s, d in zip(
                    range(1, n + 1), region.tolist(), segment.tolist(), signed_up.tolist(), strict=True
                )
            ),
        )
        n = products
        category = _draw(rng, _zipf(len(CATEGORIES), 0.8), n)
        price = np.clip(np.rint(np.exp(rng.normal(np.log(2500), 0.9, n))), 99, 500_000).astype(np.int64)
        con.executemany(
            "INSERT INTO products VALUES (?, ?, ?, ?)",
            (
                (i, f"{CATEGORIES[c].title()} #{i}", CATEGORIES[c], p)
                for i, c, p in zip(range(1, n + 1), category.tolist(), price.tolist(), strict=True)
            ),
        )
        n = orders  # the busiest customers are spread over the ids, not the first ones
        customer = rng.permutation(customers)[_draw(rng, _zipf(customers, 0.9), n)] + 1
        day = np.sort(_draw(rng, busy, n))  # ids follow time
        status = _draw(rng, np.array([0.86, 0.04, 0.06, 0.04]), n)
        con.executemany(
            "INSERT INTO orders VALUES (?, ?, ?, ?)",
            (
                (i, c, day_text[d], STATUSES[s])
                for i, c, d, s in zip(range(1, n + 1), customer.tolist(), day.tolist(), status.tolist(), strict=True)
            ),
        )
        per_order = np.minimum(rng.geometric(0.4, n), 8)
        order = np.repeat(np.arange(1, n + 1), per_order)
        items = len(order)
        product = rng.permutation(products)[_draw(rng, _zipf(products, 1.05), items)] + 1
        quantity = _draw(rng, np.array([0.6, 0.2, 0.1, 0.06, 0.04]), items) + 1
        discounted = rng.random(items) < 0.1
        unit_price = np.where(discounted, np.rint(price[product - 1] * 0.8), price[product - 1]).astype(np.int64)
        con.executemany(
            "INSERT INTO order_items VALUES (?, ?, ?, ?, ?)",
            zip(
                range(1, items + 1),
                order.tolist(),
                product.tolist(),
                quantity.tolist(),
                unit_price.tolist(),
                strict=True,
            ),
        )
        con.execute("COMMIT")
        return {
            "customers": customers,
            "products": products,
            "orders": orders,
            "order_items": items,
        }
    finally:
        con.close()


def _zipf(n: int, exponent: float) -> np.ndarray:
    return 1.0 / np.arange(1, n + 1) ** exponent


def _draw(rng: np.random.Generator, weights: np.ndarray, size: int) -> np.ndarray:
    """`size` indexes into `weights`, each drawn with probability proportional to its weight."""
    cumulative = np.cumsum(weights, dtype=np.float64)
    return np.searchsorted(cumulative / cumulative[-1], rng.random(size), side="right")


def workload(path: Path, window_months: int, sets: int) -> tuple[list[dict[str, str]], list[list[list[Any]]]]:
    """The parameter sets (regions and categories drawn uniformly, so that small ones are measured
    as well as large ones; a window of whole months) and the reference's rows for each. A set
    whose reference returns no row is skipped: it would let any query that returns nothing pass."""
    query = parse(REFERENCE.read_text()).query
    rng = np.random.Generator(np.random.PCG64(WORKLOAD_SEED))
    months = (END_DAY.year - FIRST_DAY.year) * 12 - window_months + 1
    parameters: list[dict[str, str]] = []
    rows: list[list[list[Any]]] = []
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        while len(parameters) < sets:
            region, category, month = (int(x) for x in rng.integers([0, 0, 0], [len(REGIONS), len(CATEGORIES), months]))
            candidate = {
                "region": REGIONS[region],
                "category": CATEGORIES[category],
                "start": _month(month).isoformat(),
                "end": _month(month + window_months).isoformat(),
            }
            found = [list(row) for row in con.execute(query, candidate)]
            if found:
                parameters.append(candidate)
                rows.append(found)
    finally:
        con.close()
    return parameters, rows


def _month(offset: int) -> datetime.date:
    """The first day of the month `offset` months after FIRST_DAY's."""
    year, month = divmod(FIRST_DAY.month - 1 + offset, 12)
    return datetime.date(FIRST_DAY.year + year, month + 1, 1)
