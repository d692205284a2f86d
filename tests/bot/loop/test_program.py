"""program.md's front matter: defaults, a full block, and every kind of error with a clear message."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bot.loop.program import LoopSettings, Program, SettingsError, parse_program
from runner.tasks import TASKS

PROGRAM_MD = Path(__file__).resolve().parents[3] / "program.md"

DEFAULTS = dict(
    task="training",
    max_experiments=0,
    target_val_bpb=None,
    target=None,
    first_baseline_runs=6,
    baseline_runs=2,
    noise_sigmas=2.5,
    confirm_sigmas=2.1,
    confirm_below=1.25,
    min_margin=0.0,
    confirm=True,
    remeasure_below=0.0,
    simplicity_sigmas=1.0,
    screening=False,
    screening_sigmas=0.0,
    paused=False,
)


def front(block: str, body: str = "# Program\n\nLower val_bpb.\n") -> str:
    return f"---\n{block}---\n{body}"


# --- no front matter, empty front matter ---------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "",
        "# Research program\n\nImprove train.py; lower val_bpb.\n",
        "Some text\n---\nautoresearch:\n  paused: true\n---\n",  # '---' not on the first line: no front matter
        "\n---\nautoresearch:\n  paused: true\n---\n",
    ],
    ids=["empty", "plain", "dashes-later", "leading-blank-line"],
)
def test_no_front_matter_gives_defaults_and_the_full_text(text):
    program = parse_program(text)
    assert isinstance(program, Program)
    assert program.settings.model_dump() == DEFAULTS
    assert program.instructions == text


def test_defaults_match_the_documented_values():
    assert LoopSettings().model_dump() == DEFAULTS


@pytest.mark.parametrize(
    "block",
    ["", "autoresearch:\n", "autoresearch: {}\n", "# only a comment\n"],
    ids=["empty", "null-map", "empty-map", "comment"],
)
def test_empty_front_matter_gives_defaults(block):
    program = parse_program(front(block, "body\n"))
    assert program.settings.model_dump() == DEFAULTS
    assert program.instructions.strip() == "body"


# --- a valid block -------------------------------------------------------------------------------


def test_full_block_is_parsed_and_the_body_follows():
    text = front(
        "autoresearch:\n"
        "  task: training\n"
        "  max_experiments: 50      # stop proposing after this many\n"
        "  target_val_bpb: 0.95\n"
        "  first_baseline_runs: 4\n"
        "  baseline_runs: 3\n"
        "  noise_sigmas: 1.5\n"
        "  confirm_sigmas: 1.8\n"
        "  confirm_below: 1.0\n"
        "  min_margin: 0.001\n"
        "  confirm: false\n"
        "  remeasure_below: 0.5\n"
        "  simplicity_sigmas: 0.5\n"
        "  screening: true\n"
        "  screening_sigmas: -0.5\n"
        "  paused: true\n",
        "\n\n# Research program\n\nLower val_bpb by editing train.py.\n",
    )
    program = parse_program(text)
    assert program.settings.model_dump() == dict(
        task="training",
        max_experiments=50,
        target_val_bpb=0.95,
        target=None,
        first_baseline_runs=4,
        baseline_runs=3,
        noise_sigmas=1.5,
        confirm_sigmas=1.8,
        confirm_below=1.0,
        min_margin=0.001,
        confirm=False,
        remeasure_below=0.5,
        simplicity_sigmas=0.5,
        screening=True,
        screening_sigmas=-0.5,
        paused=True,
    )
    # the body starts right at its first line: leading blank lines and the block are gone
    assert program.instructions.startswith("# Research program")
    assert program.instructions.rstrip("\n") == "# Research program\n\nLower val_bpb by editing train.py."
    assert "autoresearch" not in program.instructions and "---" not in program.instructions


def test_partial_block_keeps_the_other_defaults():
    program = parse_program(front("autoresearch:\n  paused: true\n  max_experiments: 7\n"))
    assert program.settings.model_dump() == dict(DEFAULTS, paused=True, max_experiments=7)


def test_body_may_contain_further_dashes():
    body = "# Title\n\n---\n\nafter a rule\n"
    program = parse_program(front("autoresearch:\n  confirm: false\n", body))
    assert program.settings.confirm is False
    assert program.instructions.rstrip("\n") == body.rstrip("\n")


def test_fence_lines_may_carry_surrounding_whitespace():
    program = parse_program("---  \nautoresearch:\n  baseline_runs: 4\n  ---\nbody")
    assert program.settings.baseline_runs == 4
    assert program.instructions == "body"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("baseline_runs", 1),
        ("baseline_runs", 20),
        ("noise_sigmas", 0.0),
        ("min_margin", 0.0),
        ("max_experiments", 0),
        ("target_val_bpb", 0.001),
    ],
)
def test_range_edges_are_accepted(field, value):
    program = parse_program(front(f"autoresearch:\n  {field}: {value}\n"))
    assert getattr(program.settings, field) == value


# --- errors --------------------------------------------------------------------------------------


def test_settings_error_is_a_value_error():
    assert issubclass(SettingsError, ValueError)


def test_unknown_key_under_autoresearch_is_named():
    with pytest.raises(SettingsError) as info:
        parse_program(front("autoresearch:\n  baseline_runs: 2\n  max_experimentz: 3\n"))
    assert "max_experimentz" in str(info.value)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("baseline_runs", "0"),
        ("baseline_runs", "21"),
        ("noise_sigmas", "-1"),
        ("min_margin", "-0.5"),
        ("max_experiments", "many"),
        ("max_experiments", "-3"),
        ("target_val_bpb", "0"),
        ("target_val_bpb", "low"),
        ("confirm", "maybe"),
        ("paused", "[1, 2]"),
    ],
)
def test_bad_type_or_range_names_the_field(field, value):
    with pytest.raises(SettingsError) as info:
        parse_program(front(f"autoresearch:\n  {field}: {value}\n"))
    assert f"autoresearch.{field}" in str(info.value)


@pytest.mark.parametrize("runs", ["baseline_runs: 1", "first_baseline_runs: 1"])
def test_a_single_measurement_of_main_without_confirmations_is_refused(runs):
    """It would keep pure noise: nothing would ever measure how much a run varies."""
    with pytest.raises(SettingsError, match="measured at least twice"):
        parse_program(front(f"autoresearch:\n  {runs}\n  confirm: false\n"))
    assert parse_program(front(f"autoresearch:\n  {runs}\n  confirm: true\n")).settings.confirm


def test_several_bad_fields_are_all_named():
    with pytest.raises(SettingsError) as info:
        parse_program(front("autoresearch:\n  baseline_runs: 0\n  noise_sigmas: -1\n"))
    message = str(info.value)
    assert "autoresearch.baseline_runs" in message and "autoresearch.noise_sigmas" in message


@pytest.mark.parametrize(
    "text",
    [
        "---\nautoresearch:\n  paused: true\n# Research program\n",
        "---\n",
        "---",
    ],
    ids=["block-then-body", "only-opening-line", "only-opening-no-newline"],
)
def test_unclosed_front_matter_says_to_close_it(text):
    with pytest.raises(SettingsError) as info:
        parse_program(text)
    message = str(info.value)
    assert "never closes it" in message
    assert "add a second '---'" in message


@pytest.mark.parametrize(
    "block",
    [
        "autoresearch: [unclosed\n",
        "autoresearch:\n  paused: true\n\tconfirm: false\n",
        "autoresearch: {a: 1\n",
        "autoresearch:\n  paused: true\n   confirm: : :\n",
    ],
    ids=["unclosed-list", "tab-indent", "unclosed-map", "bad-mapping"],
)
def test_invalid_yaml_is_a_settings_error(block):
    with pytest.raises(SettingsError) as info:
        parse_program(front(block))
    assert "not valid YAML" in str(info.value)


@pytest.mark.parametrize(
    ("block", "key"),
    [
        ("foo: 1\n", "foo"),
        ("max_experiments: 5\n", "max_experiments"),  # a setting at the top level instead of under autoresearch
        ("autoresearch:\n  paused: true\nextra: 1\n", "extra"),
    ],
    ids=["other-key", "setting-at-top-level", "alongside-autoresearch"],
)
def test_top_level_key_other_than_autoresearch_is_rejected(block, key):
    with pytest.raises(SettingsError) as info:
        parse_program(front(block))
    message = str(info.value)
    assert "unknown keys" in message
    assert repr(key) in message
    assert "under 'autoresearch:'" in message


@pytest.mark.parametrize("block", ["- a\n- b\n", "just a string\n", "42\n"], ids=["list", "string", "number"])
def test_front_matter_that_is_not_a_map_is_rejected(block):
    with pytest.raises(SettingsError) as info:
        parse_program(front(block))
    assert "must be a YAML map" in str(info.value)


def test_autoresearch_that_is_not_a_map_is_rejected():
    with pytest.raises(SettingsError):
        parse_program(front("autoresearch: 5\n"))


# --- the repository's own program.md -------------------------------------------------------------


def test_repository_program_md_parses():
    text = PROGRAM_MD.read_text(encoding="utf-8")
    program = parse_program(text)
    assert isinstance(program.settings, LoopSettings)
    assert "val_bpb" in program.instructions
    assert "train.py" in program.instructions
    # the front matter is not part of what the agent is told
    assert not program.instructions.startswith("---")


# --- the task -------------------------------------------------------------------------------------


def test_program_md_names_its_task_and_training_is_the_default():
    assert parse_program(front("autoresearch:\n  task: query-latency\n")).settings.task == "query-latency"
    assert parse_program(front("autoresearch:\n  paused: true\n")).settings.task == "training"


def test_an_unknown_task_is_a_settings_error_naming_the_choices():
    with pytest.raises(SettingsError) as info:
        parse_program(front("autoresearch:\n  task: sorting\n"))
    message = str(info.value)
    assert "autoresearch.task: unknown task 'sorting'" in message
    assert all(name in message for name in TASKS) and "Value error" not in message


def test_a_program_md_naming_another_task_than_the_loops_is_refused():
    """A repository holds one task: a commit that changes it is refused, and the loop keeps its settings."""
    text = front("autoresearch:\n  task: ticket-routing\n")
    with pytest.raises(SettingsError, match="this repository's loop runs 'query-latency': a repository holds one task"):
        parse_program(text, task="query-latency")
    with pytest.raises(SettingsError, match="names the task 'training'"):
        parse_program(front("autoresearch:\n  paused: true\n"), task="ticket-routing")
    assert parse_program(text, task="ticket-routing").settings.task == "ticket-routing"


# --- the target -----------------------------------------------------------------------------------


def test_a_target_is_reached_at_or_past_it_in_the_metrics_direction():
    """The loop compares main's loss (the judge's scale) with the target converted to it."""
    accuracy = parse_program(front("autoresearch:\n  task: ticket-routing\n  target: 0.9\n")).settings
    assert accuracy.metric_target == 0.9
    assert accuracy.reached_target(-0.9) and accuracy.reached_target(-0.95) and not accuracy.reached_target(-0.85)
    latency = parse_program(front("autoresearch:\n  task: query-latency\n  target: 12.5\n")).settings
    log = math.log  # p95_ms is judged on its logarithm
    assert (
        latency.reached_target(log(12.5)) and latency.reached_target(log(3.0)) and not latency.reached_target(log(13))
    )


def test_training_reaches_either_target_in_val_bpb():
    for key in ("target_val_bpb", "target"):
        settings = parse_program(front(f"autoresearch:\n  {key}: 0.95\n")).settings
        assert settings.metric_target == 0.95
        assert settings.reached_target(0.95) and not settings.reached_target(0.96)
    assert not LoopSettings().reached_target(0.0)


def test_both_targets_at_once_are_refused():
    with pytest.raises(SettingsError, match="target and target_val_bpb both set a target: keep one"):
        parse_program(front("autoresearch:\n  target: 0.9\n  target_val_bpb: 0.9\n"))


def test_target_val_bpb_for_another_task_names_the_target_to_write():
    with pytest.raises(SettingsError) as info:
        parse_program(front("autoresearch:\n  task: ticket-routing\n  target_val_bpb: 0.9\n"))
    assert "for the ticket-routing task write `target: 0.9` in accuracy's units" in str(info.value)
    assert "higher is better" in str(info.value)
