"""bench/paired_seeds.py on given numbers: the edits it makes to train.py, the order it runs in, the
paired figures it reports and how it resumes. No training runs: a fake stands in for
`autoresearch train`."""

from __future__ import annotations

import difflib
import json
import math
from pathlib import Path
from typing import Any

import benches
import pytest

ROOT = Path(__file__).resolve().parents[2]
bench = benches.load("paired_seeds")


def changed_lines(before: str, after: str) -> list[str]:
    return [
        line
        for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def test_each_change_edits_main_train_py_where_its_name_says():
    main = (ROOT / "train.py").read_text(encoding="utf-8")
    edits = {name: changed_lines(main, change(main)) for name, change in bench.CHANGES.items()}
    assert [line.split("#")[0].strip() for line in edits["warmdown-0.4"]] == [
        "-WARMDOWN_RATIO = 0.5",
        "+WARMDOWN_RATIO = 0.4",
    ]
    assert [line.split("#")[0].strip() for line in edits["matrix-lr-x1.5"]] == [
        "-MATRIX_LR = 0.04",
        "+MATRIX_LR = 0.06",
    ]
    assert [line.split("#")[0].strip() for line in edits["depth+1"]] == [
        "-DEPTH = 8",
        "+DEPTH = 9",
        "-CPU_DEPTH = 2",
        "+CPU_DEPTH = 3",
    ]
    assert [line.replace(" ", "") for line in edits["value-embed-all"]] == [
        "-returnlayer%2==(depth-1)%2#everyotherlayer,alwaysincludingthelast",
        "+returnTrue#everylayer",
    ]


def test_a_change_that_no_longer_applies_says_which_line_it_wanted():
    with pytest.raises(ValueError, match="WARMDOWN_RATIO"):
        bench.warmdown("LR = 1.0\n")
    with pytest.raises(ValueError, match="every other layer"):
        bench.value_embed_all("def has_value_embedding(layer, depth):\n    return False\n")


def test_seeds_are_read_from_ranges_and_lists():
    assert bench.parse_seeds("1-4") == [1, 2, 3, 4]
    assert bench.parse_seeds("5,1-2,2") == [5, 1, 2]


def test_runs_go_seed_by_seed_with_the_order_turned_at_each_seed():
    order = bench.schedule([1, 2, 3], ["a", "b"], repeats=1)
    assert [seed for seed, _ in order] == [1, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert [variant for _, variant in order] == [
        *("main", "a", "b", "main-again"),
        *("a", "b", "main"),
        *("b", "main", "a"),
    ]


def test_paired_figures_on_numbers_worked_by_hand():
    # main 0, 1, 2, 3 (variance 20/12); change 0.5, 1, 2.5, 3 (17/12); d 0.5, 0, 0.5, 0 (1/12)
    comparison = bench.Comparison(
        variant="x",
        seeds=[1, 2, 3, 4],
        main=[0.0, 1.0, 2.0, 3.0],
        change=[0.5, 1.0, 2.5, 3.0],
        main_steps=[40, 40, 41, 41],
        change_steps=[41, 40, 42, 41],
    )
    row = comparison.summary()
    assert row["n"] == 4
    assert row["mean_d"] == pytest.approx(0.25)
    assert row["sd_d"] == pytest.approx(math.sqrt(1 / 12))
    assert row["var_ratio"] == pytest.approx(1 / 37)
    assert row["runs_factor"] == pytest.approx(37)
    assert row["runs_factor_main_known"] == pytest.approx(17)
    assert row["corr_d_dsteps"] == pytest.approx(1.0)  # the pairs one step apart are the ones that moved
    low, high = row["corr_ci"]
    assert low < row["corr"] < high <= 1


def test_holding_the_steps_equal_takes_out_what_the_step_counts_explain():
    # two train.pys, each 0.01 lower per step it trains, at different levels, and a seed's effect
    # that both share and that does not go with the steps
    found = {
        (variant, seed): {"num_steps": steps, "val_bpb": level + shared - 0.01 * steps}
        for variant, level in (("main", 3.0), ("x", 2.0))
        for seed, steps, shared in ((1, 30, 0.01), (2, 33, 0.005), (3, 31, -0.015))
    }
    slope = bench.bpb_per_step(found)
    assert slope == pytest.approx(-0.01)
    found[("x", 2)]["num_steps"] = 36  # x ran 3 steps more than main under seed 2, and is lower for it
    found[("x", 2)]["val_bpb"] -= 0.03
    row = bench.compare(found, "x", [1, 2, 3], slope).summary()
    assert row["sd_d"] > 0.01
    assert row["sd_d_equal_steps"] == pytest.approx(0.0, abs=1e-12)
    assert row["var_ratio_equal_steps"] == pytest.approx(0.0, abs=1e-12)  # the seed explains the rest


def test_a_ratio_that_one_seed_makes_shows_in_the_range_leaving_one_seed_out():
    # seeds 1-4 pull the two sides apart; seed 5, high on both sides, alone makes them agree
    comparison = bench.Comparison(
        "x", [1, 2, 3, 4, 5], [1.0, 2.0, 1.0, 2.0, 10.0], [2.0, 1.0, 2.0, 1.0, 10.0], *[[30] * 5] * 2
    )
    row = comparison.summary()
    low, high = row["var_ratio_one_out"]
    assert row["var_ratio"] < 0.1 and low < 0.1
    assert high == pytest.approx(2.0)  # without seed 5: d = +-1 against sides of variance 1/3 each


def test_a_change_that_moves_nothing_has_no_ratio_rather_than_a_division_by_zero():
    row = bench.Comparison("same", [1, 2, 3], [1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [5, 5, 5], [5, 5, 5]).summary()
    assert row["sd_d"] == 0 and row["runs_factor"] is None and row["corr_d_dsteps"] is None
    assert bench.Comparison("one", [1], [1.0], [1.1], [5], [5]).summary() == {"variant": "one", "n": 1}


class FakeTrain:
    """Stands in for `autoresearch train --json`: a value from the seed and the variant's train.py,
    and a failure for the (variant, seed) pairs it is told to fail."""

    def __init__(self, fail: frozenset[tuple[str, int]] = frozenset()) -> None:
        self.calls: list[tuple[str, int]] = []
        self.fail = fail

    def __call__(self, asset: Path, profile: str, seed: int, out: Path, gpu: str | None) -> dict[str, Any]:
        variant = asset.stem
        self.calls.append((variant, seed))
        if (variant, seed) in self.fail:
            return {"status": "crash", "error": "boom"}
        value = 2.3 + 0.01 * seed + (0.0 if variant in ("main", "main-again") else 0.001)
        return {"status": "ok", "val_bpb": value, "metrics": {"num_steps": 40 + seed, "cpu_share": 0.5}}


def run_bench(monkeypatch, results: Path, fake: FakeTrain, *args: str) -> None:
    monkeypatch.setattr(bench, "run_variant", fake)
    bench.main(["--seeds", "1-2", "--variants", "warmdown-0.4", "--results", str(results), *args])


def test_a_second_call_runs_only_what_is_missing_failed_or_ran_another_train_py(monkeypatch, tmp_path, capsys):
    results = tmp_path / "pairs.json"
    first = FakeTrain(fail=frozenset({("warmdown-0.4", 2)}))
    run_bench(monkeypatch, results, first, "--repeats", "1")
    assert sorted(first.calls) == [
        ("main", 1),
        ("main", 2),
        ("main-again", 1),
        ("warmdown-0.4", 1),
        ("warmdown-0.4", 2),
    ]
    records = json.loads(results.read_text())
    assert [r["status"] for r in records].count("crash") == 1
    records[0]["asset_sha256"] = "an older train.py"
    results.write_text(json.dumps(records))

    second = FakeTrain()
    run_bench(monkeypatch, results, second, "--repeats", "1")
    assert sorted(second.calls) == sorted([(records[0]["variant"], records[0]["seed"]), ("warmdown-0.4", 2)])
    out = capsys.readouterr().out
    assert "| warmdown-0.4 | 2 |" in out  # both seeds paired in the table now
    assert "| main-again | 1 |" in out


def test_report_only_runs_nothing(monkeypatch, tmp_path, capsys):
    fake = FakeTrain()
    run_bench(monkeypatch, tmp_path / "none.json", fake, "--report")
    assert fake.calls == []
    assert "| warmdown-0.4 | 0 |" in capsys.readouterr().out


def test_an_unknown_variant_is_refused_with_the_known_ones(capsys):
    with pytest.raises(SystemExit):
        bench.main(["--variants", "bigger-model", "--report"])
    assert "warmdown-0.4" in capsys.readouterr().err
