"""What a proposal costs: per-token prices of the Claude models and the dollars a usage record adds up to.

The table holds list prices as of 2025; override them in settings (ClaudeConfig.prices) when yours
differ (a discount, a newer model, a price change). A model the table does not know is priced like
the most expensive family it holds, so that a spending limit is never undercounted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Prices:
    """US dollars per million tokens. `cache_write_per_mtok` is the 5-minute cache's write price
    (the ephemeral cache this agent uses), `cache_read_per_mtok` the price of a cache hit."""

    input_per_mtok: float
    output_per_mtok: float
    cache_write_per_mtok: float
    cache_read_per_mtok: float


# List prices as of 2025; override in settings. The first prefix a model name starts with wins,
# so the older, dearer Opus models come before the family's catch-all.
PRICE_TABLE: tuple[tuple[str, Prices], ...] = (
    ("claude-opus-4-0", Prices(15.0, 75.0, 18.75, 1.50)),
    ("claude-opus-4-1", Prices(15.0, 75.0, 18.75, 1.50)),
    ("claude-opus-4-2025", Prices(15.0, 75.0, 18.75, 1.50)),  # claude-opus-4-20250514
    ("claude-3-opus", Prices(15.0, 75.0, 18.75, 1.50)),
    ("claude-opus", Prices(5.0, 25.0, 6.25, 0.50)),  # Opus 4.5 and later
    ("claude-sonnet", Prices(3.0, 15.0, 3.75, 0.30)),
    ("claude-3-7-sonnet", Prices(3.0, 15.0, 3.75, 0.30)),
    ("claude-3-5-sonnet", Prices(3.0, 15.0, 3.75, 0.30)),
    ("claude-3-5-haiku", Prices(0.80, 4.0, 1.0, 0.08)),
    ("claude-3-haiku", Prices(0.25, 1.25, 0.30, 0.03)),
    ("claude-haiku", Prices(1.0, 5.0, 1.25, 0.10)),  # Haiku 4.5 and later
)
UNKNOWN_MODEL_PRICES = max((p for _, p in PRICE_TABLE), key=lambda p: p.output_per_mtok)


def prices_for(model: str) -> Prices:
    """The list prices of `model`'s family (the dearest known ones for an unknown model)."""
    name = model.strip().lower()
    for prefix, prices in PRICE_TABLE:
        if name.startswith(prefix):
            return prices
    return UNKNOWN_MODEL_PRICES


USAGE_FIELDS = ("input_tokens", "output_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")


def cost_usd(usage: Mapping[str, int | None], prices: Prices) -> float:
    """Dollars for a usage record with the API's four token counts (a missing or None count is 0).
    `input_tokens` is the uncached input only: cache writes and reads are billed on their own."""

    def n(key: str) -> int:
        return int(usage.get(key) or 0)

    dollars = (
        n("input_tokens") * prices.input_per_mtok
        + n("output_tokens") * prices.output_per_mtok
        + n("cache_creation_input_tokens") * prices.cache_write_per_mtok
        + n("cache_read_input_tokens") * prices.cache_read_per_mtok
    ) / 1e6
    return round(dollars, 6)
