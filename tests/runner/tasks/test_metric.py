"""Metric: the loss the judge minimises, and the metric's own terms people read, for each scale and direction."""

from __future__ import annotations

import math

import pytest

from runner.tasks import Metric

LATENCY = Metric("p95_ms", "milliseconds", "lower", digits=2, scale="log")
ACCURACY = Metric("accuracy", "fraction", "higher")
BPB = Metric("val_bpb", "bits per byte", "lower")


@pytest.mark.parametrize("metric", [LATENCY, ACCURACY, BPB])
@pytest.mark.parametrize("value", [0.02, 0.835, 1.0, 1963.0])
def test_value_undoes_loss(metric: Metric, value: float) -> None:
    assert metric.value(metric.loss(value)) == pytest.approx(value)


def test_a_lower_loss_is_better_in_every_direction() -> None:
    assert LATENCY.loss(28.0) < LATENCY.loss(1963.0)
    assert ACCURACY.loss(0.85) < ACCURACY.loss(0.83)
    assert BPB.loss(0.9) < BPB.loss(1.0)


def test_a_log_scale_judges_ratios_so_a_slow_and_a_fast_main_spread_alike() -> None:
    # a 10% slower run is the same difference of losses at 2 s and at 20 ms
    assert LATENCY.loss(2200.0) - LATENCY.loss(2000.0) == pytest.approx(LATENCY.loss(22.0) - LATENCY.loss(20.0))
    assert LATENCY.change(LATENCY.loss(28.0) - LATENCY.loss(1963.0)) == pytest.approx(28.0 / 1963.0 - 1)
    assert LATENCY.format_change(LATENCY.loss(28.0) - LATENCY.loss(1963.0)) == "-98.6%"
    assert LATENCY.format_margin(math.log(1.5)) == "33.3%"  # a third below main: the gain the margin asks
    assert Metric("qps", "queries per second", "higher", scale="log").format_margin(math.log(1.5)) == "50.0%"


def test_a_change_reads_in_the_metrics_direction() -> None:
    gain = ACCURACY.loss(0.851703) - ACCURACY.loss(0.835438)
    assert gain < 0 and ACCURACY.format_change(gain) == "+0.0163"
    assert BPB.format_change(-0.01) == "-0.0100" and BPB.format_margin(0.0104) == "0.0104"


def test_no_negative_zero_is_shown() -> None:
    assert ACCURACY.format_change(0.0) == "+0.0000" and f"{ACCURACY.value(0.0):.2f}" == "0.00"


def test_a_latency_of_zero_still_has_a_loss() -> None:
    assert math.isfinite(LATENCY.loss(0.0))
