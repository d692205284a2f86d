"""The progress chart: the task's metric (val_bpb for training) of every experiment in order, the
way the reference's progress.png draws it.

x is the experiment number (0 = the loop's baseline, then 1, 2, ... for the finished experiments in
order), y is the metric on its own scale, its name, unit and direction ("lower is better", or
higher) on the axis. Discarded experiments are light grey dots, kept
ones a strong colour with a short title (a square when kept for simplicity, not for a gain),
crashes, rejections and failures (no value) small marks on the bottom edge. A step line follows main's
value after each keep, with the noise margin now drawn as a band around it when one is known. A
metric judged on a log scale (a latency) gets a log y axis, its band the ratios the judge allows. A
far outlier on the worse side (a diverged run; for a higher-is-better metric, a low one) is pinned
to that edge of the range.

chart_data() is pure (the read model's chart, bot.views.read_model); write_chart() draws it. matplotlib is imported
inside write_chart, through the object-oriented Figure API with the Agg canvas: importing this module
stays cheap and never touches a display or pyplot's global state.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from bot.store import Store
from bot.views.read_model import View, view_of
from bot.views.text import places
from runner import files
from runner.tasks import TRAINING, Metric

MAX_LABELS = 30  # kept points labelled with their title; beyond that the chart becomes unreadable
LABEL_CHARS = 32
FORMATS = ("png", "svg")

KEEP_COLOUR = "#2a9d4b"
DISCARD_COLOUR = "#c8c8c8"
BASELINE_COLOUR = "#1f4e99"
CRASH_COLOUR = "#d62728"
STEP_COLOUR = "#2a9d4b"


@dataclass
class Point:
    x: int  # experiment number: 0 is the baseline
    val_bpb: float  # the metric
    status: str  # keep, discard, cancelled, or "baseline"
    title: str
    id: int = 0  # the experiment's id in the store (0 for the baseline)
    label: str | None = None  # the short title drawn beside it (kept points only, at most MAX_LABELS)
    for_simplicity: bool = False  # kept for simplicity, not for a gain


@dataclass
class ChartData:
    points: list[Point]  # the baseline, then every experiment with a value
    best_steps: list[tuple[int, float]]  # (x, main's value from then on): the baseline, then each keep
    kept: int  # experiments kept (the baseline not counted)
    crashed: int  # experiments that crashed or failed
    baseline: float | None
    best: float | None  # main's value now: the last step
    experiments: int = 0  # finished experiments (the baseline not counted)
    crashes: list[int] = field(default_factory=list)  # x of each crashed, rejected or failed experiment
    rejected: int = 0  # experiments whose run was rejected (marked with the crashes, counted apart)
    margin: float | None = None  # the noise margin now (what one run must improve on main by), drawn around `best`
    kept_for_simplicity: int = 0  # of the kept, those kept for simplicity
    metric: Metric = TRAINING.metric  # the task's: every value above is on its scale

    @property
    def gain(self) -> float | None:
        """How much better main is than the baseline, in the metric's units (positive = better)."""
        if self.baseline is None or self.best is None:
            return None
        gain = self.baseline - self.best
        return gain if self.metric.lower_is_better else -gain


def chart_data(view: View) -> ChartData:
    """The chart's numbers, from the read model: nothing is drawn here."""
    chart = view.chart
    points = [
        Point(x=p.x, val_bpb=p.val_bpb, status=p.status, title=p.title, id=p.id, for_simplicity=p.for_simplicity)
        for p in chart.points
    ]
    steps = list(chart.main_steps)
    crashes = [mark.x for mark in chart.crashes]
    rejected = sum(1 for mark in chart.crashes if mark.status == "rejected")
    _choose_labels(points, steps, view.metric)
    return ChartData(
        points=points,
        best_steps=steps,
        kept=view.counts["keep"],
        crashed=len(crashes) - rejected,
        baseline=view.baseline.val_bpb if view.baseline else None,
        best=steps[-1][1] if steps else None,
        experiments=chart.x_max,
        crashes=crashes,
        rejected=rejected,
        margin=view.main.margin,
        kept_for_simplicity=view.kept_for_simplicity,
        metric=view.metric,
    )


def _choose_labels(points: list[Point], steps: list[tuple[int, float]], metric: Metric) -> None:
    """Label the kept points; past MAX_LABELS, only those that moved main the most the better way."""
    kept = [p for p in points if p.status == "keep"]
    if len(kept) > MAX_LABELS:
        previous = dict(zip([x for x, _ in steps[1:]], [v for _, v in steps], strict=False))  # x -> main before it
        loss = metric.loss
        kept = sorted(kept, key=lambda p: (loss(p.val_bpb) - loss(previous.get(p.x, p.val_bpb)), p.x))[:MAX_LABELS]
    for point in kept:
        point.label = _short(point.title)


def _short(title: str) -> str:
    words = " ".join(title.split())
    return words if len(words) <= LABEL_CHARS else words[: LABEL_CHARS - 1].rstrip() + "…"


def write_chart(store: Store, out: Path) -> ChartData:
    """Draw the chart to `out`, a .png or .svg file (written atomically), and return its numbers."""
    out = Path(out)
    kind = out.suffix.lower().lstrip(".")
    if kind not in FORMATS:
        raise ValueError(f"cannot write a chart to {out.name}: name it .png or .svg")
    data = chart_data(view_of(store))
    figure = _draw(data)
    metadata = {"Date": None} if kind == "svg" else {"Software": None}  # same numbers, same bytes
    import matplotlib

    with matplotlib.rc_context({"svg.hashsalt": "autoresearch", "svg.fonttype": "none"}):
        files.write_atomically(out, lambda tmp: figure.savefig(tmp, format=kind, dpi=120, metadata=metadata))
    return data


def _draw(data: ChartData):
    """A matplotlib Figure of `data`, on the Agg canvas (no display, no pyplot)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(14, 7))
    FigureCanvasAgg(figure)
    ax = figure.add_subplot()
    ax.set_xlabel("experiment #")
    ax.set_ylabel(f"{data.metric.name} ({data.metric.unit})")
    if not data.points and not data.crashes:
        ax.set_title("autoresearch progress")
        ax.text(
            0.5,
            0.5,
            "no experiments yet",
            transform=ax.transAxes,
            ha="center",
            va="center",
            fontsize=16,
            color="grey",
            gid="empty",
        )
        ax.set_xticks([])
        ax.set_yticks([])
        figure.tight_layout()
        return figure

    last_x = max([p.x for p in data.points] + data.crashes)
    low, high = _y_range(data)
    lower = data.metric.lower_is_better
    pinned = high - 0.02 * (high - low) if lower else low + 0.06 * (high - low)  # a far outlier's place
    if data.best is not None and data.margin:
        metric = data.metric
        ax.axhspan(
            metric.value(metric.loss(data.best) - data.margin),
            metric.value(metric.loss(data.best) + data.margin),
            color=STEP_COLOUR,
            alpha=0.12,
            lw=0,
            label=f"noise margin {_margin_words(metric, data.margin)}",
            gid="noise-band",
        )
    if data.best_steps:
        xs = [x for x, _ in data.best_steps] + [last_x]
        ys = [v for _, v in data.best_steps] + [data.best_steps[-1][1]]
        ax.step(
            xs, ys, where="post", color=STEP_COLOUR, lw=1.8, alpha=0.8, label="main (after each keep)", gid="best-steps"
        )

    small = len(data.points) > 200
    drawn: dict[int, float] = {}
    for point in data.points:
        clipped = point.val_bpb > high if lower else point.val_bpb < low  # an outlier: pinned, pointing out
        drawn[point.x] = y = pinned if clipped else point.val_bpb
        if point.status == "baseline":
            style = {"marker": "D", "ms": 8, "color": BASELINE_COLOUR, "zorder": 4}
        elif point.status == "keep":
            style = {"marker": "s" if point.for_simplicity else "o", "ms": 7, "color": KEEP_COLOUR}
            style |= {"markeredgecolor": "black", "mew": 0.6, "zorder": 4}
        else:  # discarded, or cancelled after it was measured
            style = {"marker": "o", "ms": 3 if small else 5, "color": DISCARD_COLOUR, "zorder": 2}
        if clipped:
            style["marker"] = "^" if lower else "v"
        (line,) = ax.plot([point.x], [y], linestyle="none", **style)
        line.set_gid(f"point-{point.x}")
    for n, point in enumerate(p for p in data.points if p.label):
        ax.annotate(
            point.label,
            (point.x, drawn[point.x]),
            xytext=(6, 8 if n % 2 else -12),
            textcoords="offset points",
            fontsize=7,
            rotation=20,
            color="#174f27",
            zorder=5,
        )

    if data.crashes:  # no value: small marks along the bottom edge
        for x in data.crashes:
            (mark,) = ax.plot(
                [x],
                [0.015],
                transform=ax.get_xaxis_transform(),
                linestyle="none",
                marker="x",
                ms=4,
                color=CRASH_COLOUR,
                clip_on=False,
            )
            mark.set_gid(f"crash-{x}")
        ax.plot([], [], linestyle="none", marker="x", ms=4, color=CRASH_COLOUR, label=_marks_label(data))

    ax.plot([], [], linestyle="none", marker="o", color=DISCARD_COLOUR, label="discarded")
    ax.plot([], [], linestyle="none", marker="o", color=KEEP_COLOUR, markeredgecolor="black", label="kept")
    if any(p.for_simplicity for p in data.points):
        ax.plot(
            [],
            [],
            linestyle="none",
            marker="s",
            color=KEEP_COLOUR,
            markeredgecolor="black",
            label="kept for simplicity",
        )
    if data.metric.relative:
        from matplotlib.ticker import LogFormatter

        ax.set_yscale("log")  # a log-scale metric is judged by its ratios: equal ratios, equal heights
        ax.yaxis.set_major_formatter(LogFormatter())  # 20, not 2 x 10^1
        ax.yaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
    ax.set_ylim(low, high)
    ax.set_xlim(-0.02 * last_x - 0.5, last_x * 1.02 + 0.5)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right", fontsize=8)
    ax.set_title(_title(data), fontsize=11)
    ax.text(
        0.0, 1.01, f"{data.metric.direction} is better", transform=ax.transAxes, fontsize=8, color="grey", va="bottom"
    )
    figure.tight_layout()
    return figure


def _margin_words(metric: Metric, margin: float) -> str:
    """The band's legend: "±0.0104", or on a log scale the two changes it spans ("-53.0% / +112.9%")."""
    if metric.relative:
        return " / ".join(f"{100 * change:+.1f}%" for change in sorted((metric.change(-margin), metric.change(margin))))
    return f"±{metric.format_margin(margin, places(metric) - 2)}"


def _y_range(data: ChartData) -> tuple[float, float]:
    """Room for every point near main, with far outliers (a diverged run) left out on the worse side,
    where they are pinned to the edge: worked out on the loss scale (better is lower), then drawn on
    the metric's (for a higher-is-better one, the worse side is the bottom, below the crash marks' row;
    for a log-scale one the margins are ratios, as its log axis draws them)."""
    loss, value = data.metric.loss, data.metric.value
    values = [loss(p.val_bpb) for p in data.points]
    if not values:
        return 0.0, 1.0
    low = min(values)
    if data.best is not None and data.margin:
        low = min(low, loss(data.best) - data.margin)
    ordered = sorted(values)
    baseline = loss(data.baseline) if data.baseline is not None else None
    usual = max(ordered[round(0.9 * (len(ordered) - 1))], baseline or low)  # the 90th percentile
    high = min(ordered[-1], usual + max(usual - low, 1e-3))
    span = high - low or 0.01
    if data.metric.lower_is_better:
        return value(low - 0.1 * span), value(high + 0.06 * span)  # the crash marks' row below the lowest point
    # the crash marks' row, then the pinned outliers, at the bottom
    return value(high + 0.16 * span), value(low - 0.1 * span)


def _marks_label(data: ChartData) -> str:
    """The legend of the marks of experiments without a value: what they were, and how many."""
    if not data.rejected:
        return f"crash or failure ({data.crashed})"
    what = "rejection" if not data.crashed else "crash, rejection or failure"
    return f"{what} ({data.crashed + data.rejected})"


def _title(data: ChartData) -> str:
    head = f"{data.experiments} experiments, {data.kept} kept"
    if data.kept_for_simplicity:
        head += f" ({data.kept_for_simplicity} for simplicity)"
    if data.crashed:
        head += f", {data.crashed} crashed"
    if data.rejected:
        head += f", {data.rejected} rejected"
    if data.best is None:
        return head
    n = places(data.metric)
    line = f"best {data.metric.name} {data.best:.{n}f} (main now)"
    if data.baseline:
        change = data.best - data.baseline  # on the metric's scale: its sign is the direction's
        line += f", {change:+.{n}f} ({100 * change / data.baseline:+.2f}%) vs baseline {data.baseline:.{n}f}"
    return f"{head}\n{line}"
