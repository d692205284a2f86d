"""The progress chart from a store built by hand: its numbers (points, main's steps, crash counts,
labels) and the files it writes (a PNG matplotlib reads back, an SVG with one marker per point)."""

from __future__ import annotations

import random
import re
import sys
from pathlib import Path

import pytest

from bot.loop.judge import JudgeConfig, margin, pooled_noise
from bot.store import Store
from bot.views import plot
from bot.views.read_model import view_of

MAIN_A = "aaaaaaa" + "1" * 33
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# the allowed moves that take a new proposal to done (as in test_results.py)
TO_DONE = ["branched", "measuring", "closing", "done"]
SIX_RUNS = (0.995, 1.005, 0.998, 1.002, 1.0, 1.0)  # main measured six times: mean 1.0


@pytest.fixture
def store(tmp_path: Path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def baseline(store: Store, *values: float | None) -> None:
    """Finished baseline runs of the first main (None: a crashed one)."""
    for value in values:
        run = store.runs.add(
            experiment_id=None,
            purpose="baseline",
            code_hash="A",
            commit_sha=MAIN_A,
            base_sha=MAIN_A,
            asset="print()\n",
            profile="cpu",
        )
        store.runs.finish(
            run.id,
            status="ok" if value is not None else "crash",
            val_bpb=value,
            metrics={},
            error=None if value is not None else "boom",
            log_tail="",
        )


def finished(
    store: Store,
    title: str,
    status: str,
    val_bpb: float | None = None,
    *,
    margin: float | None = None,
    run: bool = True,
) -> None:
    """One experiment taken through the allowed moves to done with `status` and numbers."""
    started = store.experiments.start_proposing(MAIN_A)
    exp = store.experiments.fill_proposal(
        started.id,
        title=title,
        hypothesis="because",
        slug="x",
        code_hash=f"code-{started.id}",
        asset="print()\n",
        meta={},
    )
    if run:
        queued = store.runs.add(
            experiment_id=exp.id,
            purpose="candidate",
            code_hash=f"code-{exp.id}",
            commit_sha="f" * 40,
            base_sha=MAIN_A,
            asset="print()\n",
            profile="cpu",
        )
        ok = status not in ("crash", "failed")
        store.runs.finish(
            queued.id,
            status="ok" if ok else "crash",
            val_bpb=val_bpb if ok else None,
            metrics={},
            error=None if ok else "boom",
            log_tail="",
        )
    for step in TO_DONE:
        store.experiments.update(exp.id, state=step)
    store.experiments.update(
        exp.id,
        status=status,
        val_bpb=val_bpb,
        margin=margin,
        delta=None if val_bpb is None else val_bpb - 1.0,
        reason=f"{status} because",
    )


@pytest.fixture
def history(store: Store) -> Store:
    """Baseline 1.0 (six runs and a crash), then 1 keep 0.98, 2 discard 0.99, 3 crash, 4 keep 0.95,
    5 failed, 6 discard 1.30 (an outlier), 7 cancelled before measuring, 8 keep 0.94, 9 discard 0.96."""
    baseline(store, *SIX_RUNS, None)
    finished(store, "Raise the learning rate", "keep", 0.98, margin=0.01)
    finished(store, "Deeper model", "discard", 0.99, margin=0.01)
    finished(store, "Huge batch", "crash")
    finished(store, "Rotary embeddings with a much longer base and a new schedule", "keep", 0.95, margin=0.008)
    finished(store, "Gave up rebasing", "failed")
    finished(store, "Diverged", "discard", 1.30, margin=0.008)
    finished(store, "Closed by a person", "cancelled", run=False)
    finished(store, "Warmup", "keep", 0.94, margin=0.006)
    finished(store, "Weight decay", "discard", 0.96)
    return store


# --- chart_data ----------------------------------------------------------------------------------


def test_chart_data_has_the_baseline_then_one_point_per_experiment_with_a_val_bpb(history: Store):
    data = plot.chart_data(view_of(history))
    assert [(p.x, p.status) for p in data.points] == [
        (0, "baseline"),
        (1, "keep"),
        (2, "discard"),
        (4, "keep"),
        (6, "discard"),
        (8, "keep"),
        (9, "discard"),
    ]
    assert data.points[0].val_bpb == pytest.approx(1.0)
    assert [p.val_bpb for p in data.points[1:]] == [0.98, 0.99, 0.95, 1.30, 0.94, 0.96]
    assert data.experiments == 9


def test_main_steps_down_at_each_keep(history: Store):
    data = plot.chart_data(view_of(history))
    assert [x for x, _ in data.best_steps] == [0, 1, 4, 8]
    assert [v for _, v in data.best_steps] == pytest.approx([1.0, 0.98, 0.95, 0.94])
    assert data.baseline == pytest.approx(1.0) and data.best == 0.94
    assert data.gain == pytest.approx(0.06)
    # the noise margin now, as the dashboard shows it: one run against main's six
    assert data.margin == pytest.approx(margin(pooled_noise([SIX_RUNS]), 1, 6, JudgeConfig()))


def test_crashes_and_failures_are_counted_and_placed_not_plotted(history: Store):
    data = plot.chart_data(view_of(history))
    assert data.crashed == 2 and data.crashes == [3, 5]
    assert data.kept == 3
    assert not {3, 5, 7} & {p.x for p in data.points}  # crash, failed, and cancelled-unmeasured: no dot


def test_only_kept_points_carry_a_short_label(history: Store):
    labels = {p.x: p.label for p in plot.chart_data(view_of(history)).points if p.label}
    assert set(labels) == {1, 4, 8}
    assert labels[1] == "Raise the learning rate"
    assert len(labels[4]) <= plot.LABEL_CHARS and labels[4].endswith("…")


def test_chart_data_of_an_empty_store(store: Store):
    data = plot.chart_data(view_of(store))
    assert (data.points, data.best_steps, data.kept, data.crashed) == ([], [], 0, 0)
    assert data.baseline is None and data.best is None and data.gain is None


def test_without_a_baseline_the_steps_start_at_the_first_keep(store: Store):
    baseline(store, None)  # the baseline crashed
    finished(store, "a", "discard", 1.1)
    finished(store, "b", "keep", 0.9)
    data = plot.chart_data(view_of(store))
    assert data.baseline is None and [p.x for p in data.points] == [1, 2]
    assert data.best_steps == [(2, 0.9)] and data.best == 0.9 and data.gain is None


def test_a_diverged_run_does_not_squash_the_chart(history: Store):
    data = plot.chart_data(view_of(history))
    low, high = plot._y_range(data)
    assert low < 0.94 - data.margin and 1.0 < high < 1.30  # the 1.30 outlier is pinned to the top edge


def many(store: Store, n: int, seed: int = 0) -> None:
    """n experiments in one transaction (one commit: fast): 1 in 10 kept, 1 in 20 crashed."""
    rng = random.Random(seed)
    with store.transaction():
        baseline(store, 1.0)
        main = 1.0
        for i in range(1, n + 1):
            if i % 20 == 0:
                finished(store, f"crash {i}", "crash", run=False)
            elif i % 10 == 0:
                main -= 0.001
                finished(store, f"keep {i}", "keep", main, margin=0.002, run=False)
            else:
                finished(store, f"try {i}", "discard", main + rng.uniform(0.0, 0.05), run=False)


def test_a_thousand_experiments_get_at_most_thirty_labels(store: Store):
    many(store, 1000)
    data = plot.chart_data(view_of(store))
    assert data.experiments == 1000 and data.crashed == 50 and data.kept == 50
    assert len(data.points) == 1 + 950
    assert len(data.best_steps) == 1 + 50
    labelled = [p for p in data.points if p.label]
    assert len(labelled) == plot.MAX_LABELS and all(p.status == "keep" for p in labelled)


def test_a_crowded_chart_is_drawn(store: Store, tmp_path: Path):
    """Past 200 points the discarded ones are drawn smaller; 250 experiments are enough for that
    (drawing a thousand costs seconds and shows nothing more)."""
    many(store, 250)
    data = plot.write_chart(store, tmp_path / "big.png")
    assert len(data.points) > 200
    assert (tmp_path / "big.png").read_bytes().startswith(PNG_SIGNATURE)


# --- write_chart ---------------------------------------------------------------------------------


def test_write_chart_png_reads_back(history: Store, tmp_path: Path):
    from matplotlib import image

    out = tmp_path / "progress.png"
    data = plot.write_chart(history, out)
    assert data == plot.chart_data(view_of(history))
    assert out.read_bytes()[:8] == PNG_SIGNATURE
    pixels = image.imread(out)
    assert pixels.ndim == 3 and pixels.shape[0] > 0 and pixels.shape[1] > 0
    assert pixels.std() > 0  # something was drawn
    assert not list(tmp_path.glob("*.tmp"))  # written atomically: no temporary file left behind


def test_write_chart_svg_has_one_marker_per_point_and_per_crash(history: Store, tmp_path: Path):
    out = tmp_path / "progress.svg"
    data = plot.write_chart(history, out)
    svg = out.read_text()
    assert svg.lstrip().startswith("<?xml") and "</svg>" in svg
    points = re.findall(r'id="point-(\d+)"', svg)
    assert sorted(map(int, points)) == [p.x for p in data.points]
    assert sorted(map(int, re.findall(r'id="crash-(\d+)"', svg))) == [3, 5]
    assert 'id="best-steps"' in svg and 'id="noise-band"' in svg
    assert "9 experiments, 3 kept, 2 crashed" in svg  # the title, as text (svg.fonttype none)
    assert "best val_bpb 0.940000" in svg and "lower is better" in svg
    assert "Raise the learning rate" in svg and "Deeper model" not in svg  # only kept ones labelled
    assert "for simplicity" not in svg  # no keep for simplicity: no legend entry for one


def test_a_keep_for_simplicity_is_a_square_with_its_own_legend_entry(history: Store, tmp_path: Path):
    history.experiments.update(4, meta={"kept_for_simplicity": {"lines": 2, "tokens": 9, "loss_margin": 0.004}})
    data = plot.write_chart(history, tmp_path / "progress.svg")
    assert [p.id for p in data.points if p.for_simplicity] == [4] and data.kept_for_simplicity == 1
    svg = (tmp_path / "progress.svg").read_text()
    assert "9 experiments, 3 kept (1 for simplicity), 2 crashed" in svg and "kept for simplicity" in svg


def test_write_chart_is_deterministic(history: Store, tmp_path: Path):
    plot.write_chart(history, tmp_path / "a.svg")
    plot.write_chart(history, tmp_path / "b.svg")
    assert (tmp_path / "a.svg").read_bytes() == (tmp_path / "b.svg").read_bytes()


def test_write_chart_of_an_empty_store_says_so(store: Store, tmp_path: Path):
    from matplotlib import image

    data = plot.write_chart(store, tmp_path / "empty.svg")
    assert data.points == []
    assert "no experiments yet" in (tmp_path / "empty.svg").read_text()
    plot.write_chart(store, tmp_path / "empty.png")
    assert image.imread(tmp_path / "empty.png").shape[0] > 0


@pytest.mark.parametrize("name", ["progress.pdf", "progress", "progress.png.txt"])
def test_write_chart_refuses_other_formats(store: Store, tmp_path: Path, name: str):
    with pytest.raises(ValueError, match=r"\.png or \.svg"):
        plot.write_chart(store, tmp_path / name)
    assert not (tmp_path / name).exists()


def test_importing_the_module_leaves_matplotlib_alone():
    import subprocess

    code = "import sys, bot.views.plot; print('matplotlib' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=Path(__file__).parents[3]
    )
    assert out.stdout.strip() == "False"
