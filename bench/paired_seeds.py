"""Benchmark: how much of the run-to-run noise a shared seed removes (paired seeds, issue 18).

Runs main's train.py and a few changes of different kinds, each under the same seeds, through
`autoresearch train --json` (the sandboxed path every runner takes), and compares each change with
main seed by seed. The seed sets torch's generator (the model's initial weights); the data order is
the same in every run whatever the seed. What a shared seed cannot remove is the clock: a CPU run
trains for a budget of CPU time, and the steps it fits in that budget vary from run to run.

The changes (each an edit of main's train.py, applied here and checked to apply exactly once):
    warmdown-0.4      WARMDOWN_RATIO = 0.4                          a schedule constant
    matrix-lr-x1.5    MATRIX_LR times 1.5                           a learning rate
    depth+1           DEPTH and CPU_DEPTH plus one (wider too)      the model's size
    value-embed-all   a value embedding in every layer, not every   a new piece of the model
                      other one (its construction draws from the
                      generator before init_weights, so, as with
                      depth+1, no weight starts as main's does)
    main-again        main's train.py once more, on the first       how deterministic a run is:
                      --repeats seeds only                          same value? same steps?

Runs go seed by seed, every variant of a seed before the next seed, the order of the variants
turned by one at each seed, so that a change of load on the machine hits every variant alike.
Each result is written to the results file as it ends (`--results`); a second call with the same
file runs only what is missing or failed, and `--report` only prints the tables. A result counts
only for the train.py it ran: after an edit of main the old records are ignored.

For each change, over the seeds where both it and main were measured:
    sd main, sd change        the spread of each side's val_bpb across seeds
    mean d, sd d              d = change - main under the same seed
    corr                      Pearson's correlation of the two sides, with a 95% interval (Fisher's z)
    var ratio                 var(d) / (var(main) + var(change)): the paired difference's variance
                              as a fraction of an unpaired one's
    one seed out              the lowest and highest var ratio leaving one seed out: whether a
                              single seed (two runs under one burst of load, say) makes the ratio
    x runs                    1 / var ratio: how many times more runs an unpaired comparison needs
                              for the same standard error of the difference
    x runs, main known        var(change) / var(d): the same when main's mean is known already
                              (pooled over many runs) and each candidate run meets a run of main
                              under its seed that is there already
    corr(d, dsteps)           whether the pairs whose step counts differ more are the off ones
    sd d at equal steps       the sd of d - slope * dsteps, the slope being val_bpb's on num_steps
                              within each variant, pooled: what pairing would leave if both runs of
                              a pair trained the same number of steps
    var ratio at equal steps  the var ratio with every value moved by -slope * its steps: how much
                              of the rest the seed explains, once the step counts are held equal

    .venv/bin/python bench/paired_seeds.py --seeds 1-8 --profile cpu [--variants warmdown-0.4,depth+1]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
MAIN = "main"
REPEAT = "main-again"


def set_constant(source: str, name: str, value: Callable[[str], str]) -> str:
    """`source` with the top-level constant `name` set to value(its current value), its comment kept."""
    pattern = re.compile(rf"^({re.escape(name)}\s*=\s*)([^\s#]+)", re.MULTILINE)
    matches = pattern.findall(source)
    if len(matches) != 1:
        raise ValueError(f"train.py has {len(matches)} lines setting {name}, not one: the variant needs updating")
    return pattern.sub(lambda m: m.group(1) + value(m.group(2)), source)


def replace_once(source: str, old: str, new: str) -> str:
    count = source.count(old)
    if count != 1:
        raise ValueError(f"train.py holds {old!r} {count} times, not once: the variant needs updating")
    return source.replace(old, new)


def warmdown(source: str) -> str:
    return set_constant(source, "WARMDOWN_RATIO", lambda _: "0.4")


def matrix_lr(source: str) -> str:
    return set_constant(source, "MATRIX_LR", lambda v: repr(round(float(v) * 1.5, 6)))


def depth_plus_one(source: str) -> str:
    for name in ("DEPTH", "CPU_DEPTH"):
        source = set_constant(source, name, lambda v: str(int(v) + 1))
    return source


def value_embed_all(source: str) -> str:
    return replace_once(
        source,
        "    return layer % 2 == (depth - 1) % 2  # every other layer, always including the last",
        "    return True  # every layer",
    )


def unchanged(source: str) -> str:
    return source


CHANGES: dict[str, Callable[[str], str]] = {
    "warmdown-0.4": warmdown,
    "matrix-lr-x1.5": matrix_lr,
    "depth+1": depth_plus_one,
    "value-embed-all": value_embed_all,
}
VARIANTS: dict[str, Callable[[str], str]] = {MAIN: unchanged, **CHANGES, REPEAT: unchanged}


def parse_seeds(text: str) -> list[int]:
    """'1-8' or '1,3,5' or '1-3,7' as a list of seeds, in order, without repeats."""
    seeds: list[int] = []
    for part in text.split(","):
        low, _, high = part.strip().partition("-")
        for seed in range(int(low), int(high or low) + 1):
            if seed not in seeds:
                seeds.append(seed)
    if not seeds:
        raise ValueError(f"no seeds in {text!r}")
    return seeds


def schedule(seeds: list[int], changes: list[str], repeats: int) -> list[tuple[int, str]]:
    """(seed, variant) in the order to run them: seed by seed, main and every change under each seed
    (main once more under the first `repeats` seeds), the order turned by one at each seed."""
    order: list[tuple[int, str]] = []
    for index, seed in enumerate(seeds):
        variants = [MAIN, *changes] + ([REPEAT] if index < repeats else [])
        turn = index % len(variants)
        order += [(seed, variant) for variant in variants[turn:] + variants[:turn]]
    return order


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def run_variant(asset: Path, profile: str, seed: int, out: Path, gpu: str | None) -> dict[str, Any]:
    """One `autoresearch train --json` run; its ResultSpec as a dict (a failure's too, when it printed one)."""
    cli = Path(sys.executable).with_name("autoresearch")
    command = [str(cli), "train", "--profile", profile, "--asset", str(asset), "--seed", str(seed)]
    command += ["--out", str(out), "--json"] + (["--gpu", gpu] if gpu else [])
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=False)
    last = (done.stdout.strip().splitlines() or [""])[-1]
    try:
        return json.loads(last)
    except ValueError:  # it refused before running (a bad profile or asset): its error is on stdout
        return {"status": "crash", "error": f"autoresearch train exited {done.returncode}: {last or 'no output'}"}


def record(
    variant: str, seed: int, profile: str, source_sha: str, result: dict[str, Any], **extra: Any
) -> dict[str, Any]:
    metrics = result.get("metrics") or {}
    return {
        "variant": variant,
        "seed": seed,
        "profile": profile,
        "asset_sha256": source_sha,
        "status": result.get("status"),
        "error": result.get("error"),
        "val_bpb": result.get("val_bpb"),
        "num_steps": metrics.get("num_steps"),
        "cpu_share": metrics.get("cpu_share"),
        "total_seconds": (result.get("timings") or {}).get("total"),
        "sandboxed": result.get("sandboxed"),
        **extra,
    }


def load_records(path: Path) -> list[dict[str, Any]]:
    return json.loads(path.read_text()) if path.exists() else []


def save_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Write the whole list to a temporary file, then rename: an interrupted write loses nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text(json.dumps(records, indent=1))
    temporary.replace(path)


def current(records: Iterable[dict[str, Any]], profile: str, shas: dict[str, str]) -> dict[tuple[str, int], dict]:
    """The measured runs of this profile whose train.py is each variant's now, by (variant, seed);
    the last one wins."""
    found: dict[tuple[str, int], dict] = {}
    for r in records:
        if r["profile"] == profile and r["status"] == "ok" and shas.get(r["variant"]) == r["asset_sha256"]:
            found[(r["variant"], r["seed"])] = r
    return found


@dataclass(frozen=True)
class Comparison:
    variant: str
    seeds: list[int]
    main: list[float]
    change: list[float]
    main_steps: list[int]
    change_steps: list[int]
    bpb_per_step: float | None = None  # val_bpb's slope on the step count, to hold the steps equal

    @property
    def diffs(self) -> list[float]:
        return [b - a for a, b in zip(self.main, self.change, strict=True)]

    @property
    def step_diffs(self) -> list[int]:
        return [b - a for a, b in zip(self.main_steps, self.change_steps, strict=True)]

    def ratio_range_one_seed_out(self) -> tuple[float, float] | None:
        """The lowest and highest var ratio over the comparisons that leave one seed out: how much
        the ratio owes to a single seed. None below 4 seeds."""
        ratios = []
        for left_out in range(len(self.seeds)):
            main = self.main[:left_out] + self.main[left_out + 1 :]
            change = self.change[:left_out] + self.change[left_out + 1 :]
            if len(main) < 3:
                return None
            spread = statistics.variance(main) + statistics.variance(change)
            if spread > 0:
                ratios.append(statistics.variance([b - a for a, b in zip(main, change, strict=True)]) / spread)
        return (min(ratios), max(ratios)) if ratios else None

    def summary(self) -> dict[str, Any]:
        """The figures of the module's docstring; None where too few seeds or no spread make one."""
        n = len(self.seeds)
        row: dict[str, Any] = {"variant": self.variant, "n": n}
        if n < 2:
            return row
        var_a, var_b, var_d = (statistics.variance(x) for x in (self.main, self.change, self.diffs))
        row |= {
            "sd_main": math.sqrt(var_a),
            "sd_change": math.sqrt(var_b),
            "mean_d": statistics.fmean(self.diffs),
            "sd_d": math.sqrt(var_d),
            "corr": correlation(self.main, self.change),
            "corr_ci": fisher_interval(correlation(self.main, self.change), n),
            "var_ratio": var_d / (var_a + var_b) if var_a + var_b > 0 else None,
            "runs_factor": (var_a + var_b) / var_d if var_d > 0 else None,
            "runs_factor_main_known": var_b / var_d if var_d > 0 else None,
            "corr_d_dsteps": correlation(self.diffs, self.step_diffs),
            "var_ratio_one_out": self.ratio_range_one_seed_out(),
        }
        if self.bpb_per_step is not None:  # each value moved to where its run would be at no steps at all
            slope = self.bpb_per_step
            held_a = [a - slope * steps for a, steps in zip(self.main, self.main_steps, strict=True)]
            held_b = [b - slope * steps for b, steps in zip(self.change, self.change_steps, strict=True)]
            held_d = [b - a for a, b in zip(held_a, held_b, strict=True)]
            var_held = statistics.variance(held_a) + statistics.variance(held_b)
            row["sd_d_equal_steps"] = statistics.stdev(held_d)
            row["var_ratio_equal_steps"] = statistics.variance(held_d) / var_held if var_held > 0 else None
        return row


def correlation(x: list[float], y: list[float]) -> float | None:
    """Pearson's r, or None when either side does not vary."""
    if len(x) < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    return statistics.correlation(x, y)


def fisher_interval(r: float | None, n: int) -> tuple[float, float] | None:
    """A 95% interval for a correlation r from n pairs (Fisher's z); None below 4 pairs."""
    if r is None or n < 4:
        return None
    z, half = math.atanh(max(-0.999999, min(0.999999, r))), 1.96 / math.sqrt(n - 3)
    return math.tanh(z - half), math.tanh(z + half)


def bpb_per_step(found: dict[tuple[str, int], dict]) -> float | None:
    """val_bpb's slope on num_steps within each variant, pooled over the variants (each one's runs
    centred on its own means): what one more step of the same train.py is worth. None without spread."""
    groups: dict[str, list[tuple[int, float]]] = {}
    for (variant, _), r in found.items():
        groups.setdefault(variant, []).append((r["num_steps"], r["val_bpb"]))
    products = spread = 0.0
    for runs in groups.values():
        mean_steps, mean_bpb = statistics.fmean(s for s, _ in runs), statistics.fmean(b for _, b in runs)
        products += sum((s - mean_steps) * (b - mean_bpb) for s, b in runs)
        spread += sum((s - mean_steps) ** 2 for s, _ in runs)
    return products / spread if spread > 0 else None


def compare(
    found: dict[tuple[str, int], dict], variant: str, seeds: list[int], slope: float | None = None
) -> Comparison:
    both = [s for s in seeds if (MAIN, s) in found and (variant, s) in found]
    return Comparison(
        variant=variant,
        seeds=both,
        main=[found[(MAIN, s)]["val_bpb"] for s in both],
        change=[found[(variant, s)]["val_bpb"] for s in both],
        main_steps=[found[(MAIN, s)]["num_steps"] for s in both],
        change_steps=[found[(variant, s)]["num_steps"] for s in both],
        bpb_per_step=slope,
    )


def fmt(value: Any, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, tuple):
        return f"[{value[0]:.2f}, {value[1]:.2f}]"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def summary_table(comparisons: list[Comparison]) -> str:
    header = (
        "| change | seeds | sd main | sd change | mean d | sd d | corr (95%) | var(d)/(var a+var b) | one seed out "
        "| x runs | x runs, main known | corr(d, dsteps) | sd d at equal steps | var ratio at equal steps |"
    )
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for c in comparisons:
        s = c.summary()
        corr = fmt(s.get("corr"), 2) + (f" {fmt(s['corr_ci'])}" if s.get("corr_ci") else "")
        lines.append(
            f"| {c.variant} | {s['n']} | {fmt(s.get('sd_main'))} | {fmt(s.get('sd_change'))} | "
            f"{fmt(s.get('mean_d'), 4)} | {fmt(s.get('sd_d'))} | {corr} | "
            f"{fmt(s.get('var_ratio'), 3)} | {fmt(s.get('var_ratio_one_out'))} | {fmt(s.get('runs_factor'), 2)} | "
            f"{fmt(s.get('runs_factor_main_known'), 2)} | {fmt(s.get('corr_d_dsteps'), 2)} | "
            f"{fmt(s.get('sd_d_equal_steps'))} | {fmt(s.get('var_ratio_equal_steps'), 3)} |"
        )
    return "\n".join(lines)


def seed_table(comparisons: list[Comparison], found: dict[tuple[str, int], dict], seeds: list[int]) -> str:
    """Per seed: main's val_bpb and steps, then each change's d and its steps."""
    header = "| seed | main (steps) | " + " | ".join(f"{c.variant}: d (steps)" for c in comparisons) + " |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for seed in seeds:
        if (MAIN, seed) not in found:
            continue
        base = found[(MAIN, seed)]
        cells = [f"{base['val_bpb']:.4f} ({base['num_steps']})"]
        for c in comparisons:
            other = found.get((c.variant, seed))
            cells.append("-" if other is None else f"{other['val_bpb'] - base['val_bpb']:+.4f} ({other['num_steps']})")
        lines.append(f"| {seed} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(
    records: list[dict[str, Any]], profile: str, shas: dict[str, str], seeds: list[int], variants: list[str]
) -> str:
    found = current(records, profile, shas)
    slope = bpb_per_step(found)
    comparisons = [compare(found, v, seeds, slope) for v in variants if v != MAIN]
    ours = list(found.values())
    loads = [r[k] for r in ours for k in ("load_before", "load_after") if r.get(k) is not None]
    shares = [r["cpu_share"] for r in ours if r.get("cpu_share")]
    walls = [r["total_seconds"] for r in ours if r.get("total_seconds")]
    failed = [r for r in records if r["profile"] == profile and r["status"] != "ok"]
    notes = [
        f"profile {profile}: {len(ours)} measured runs"
        + (f", {len(failed)} failed" if failed else "")
        + (f"; load average (1 min) {min(loads):.1f}-{max(loads):.1f}" if loads else "")
        + (f"; cpu share {min(shares):.2f}-{max(shares):.2f}" if shares else "")
        + (f"; a run took {statistics.median(walls):.0f} s (median)" if walls else ""),
        f"val_bpb per step, within each train.py: {fmt(slope, 5)} (sd d at equal steps: d less it times dsteps)",
    ]
    return "\n\n".join([summary_table(comparisons), seed_table(comparisons, found, seeds), *notes])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="1-8", help="'1-8', '1,3,5' (default 1-8)")
    parser.add_argument("--profile", default="cpu")
    parser.add_argument(
        "--variants", default=",".join(CHANGES), help=f"changes to compare with main: {', '.join(CHANGES)}"
    )
    parser.add_argument(
        "--repeats", type=int, default=2, help="main runs once more under the first N seeds (default 2)"
    )
    parser.add_argument("--asset", type=Path, default=ROOT / "train.py", help="main's train.py")
    parser.add_argument(
        "--results", type=Path, default=None, help="the results file (default runs/paired-seeds-PROFILE.json)"
    )
    parser.add_argument("--gpu", default=None, help="the NVIDIA device index (a CUDA profile)")
    parser.add_argument("--report", action="store_true", help="print the tables from the results file; run nothing")
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    changes = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in changes if v not in CHANGES]
    if unknown:
        parser.error(f"unknown variants {', '.join(unknown)}: choose from {', '.join(CHANGES)}")
    results = args.results or ROOT / "runs" / f"paired-seeds-{args.profile}.json"
    base = args.asset.read_text(encoding="utf-8")
    sources = {v: VARIANTS[v](base) for v in [MAIN, *changes, REPEAT]}  # fails here if an edit no longer applies
    shas = {v: sha256(text) for v, text in sources.items()}
    variants = [MAIN, *changes] + ([REPEAT] if args.repeats > 0 else [])
    records = load_records(results)
    if not args.report:
        done = current(records, args.profile, shas)
        todo = [(s, v) for s, v in schedule(seeds, changes, args.repeats) if (v, s) not in done]
        print(f"{len(todo)} runs to go; results in {results}", flush=True)
        with tempfile.TemporaryDirectory(prefix="paired-seeds-") as tmp:
            for number, (seed, variant) in enumerate(todo, 1):
                asset = Path(tmp) / f"{variant}.py"
                asset.write_text(sources[variant], encoding="utf-8")
                load_before, started = os.getloadavg()[0], time.time()
                result = run_variant(asset, args.profile, seed, Path(tmp) / f"{variant}-{seed}", args.gpu)
                entry = record(
                    variant,
                    seed,
                    args.profile,
                    shas[variant],
                    result,
                    load_before=round(load_before, 2),
                    load_after=round(os.getloadavg()[0], 2),
                    wall_s=round(time.time() - started, 1),
                    finished_at=time.strftime("%Y-%m-%dT%H:%M:%S"),
                )
                records.append(entry)
                save_records(results, records)
                print(
                    f"[{number}/{len(todo)}] seed {seed} {variant}: {entry['status']} val_bpb {fmt(entry['val_bpb'])} "
                    f"steps {entry['num_steps']} ({entry['wall_s']:.0f} s, load {load_before:.1f})"
                    + (f": {entry['error']}" if entry["status"] != "ok" else ""),
                    flush=True,
                )
    print(report(records, args.profile, shas, seeds, variants))


if __name__ == "__main__":
    main()
