"""The checks every proposal passes before it is pushed: compiles, small enough, keeps the harness,
and is new code (comments and layout do not make an experiment)."""

from __future__ import annotations

from pathlib import Path

from bot.loop import validation

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
