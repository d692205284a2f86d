"""The harness hash of a task other than training covers what measures (its evaluator's code and
reference queries, runner/tasks/'s spec and run, training's harness) and leaves out its starting
material (the starter asset, program.md) and vendored inputs, which the data fingerprint covers:
a new starter keeps the baselines, a changed evaluator starts new ones."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runner import profiles
from runner.profiles import MEASURING_FILES, harness_files, harness_hash


def names(task: str) -> set[str]:
    return {name for name, _ in harness_files(task)}


def test_ticket_routing_hashes_its_evaluator_and_host_not_its_starter_program_or_sample() -> None:
    found = names("ticket-routing")
    assert {"ticket_routing/evaluation.py", "ticket_routing/host.py", "ticket_routing/tickets.py"} <= found
    assert {"tasks/__init__.py", "tasks/run.py", *MEASURING_FILES} <= found
    assert not {name for name in found if name.endswith(("router.py", ".md", ".csv"))}


def test_query_latency_hashes_its_reference_query_not_its_starting_query() -> None:
    found = names("query-latency")
    assert {"query_latency/measure.py", "query_latency/guard.py", "query_latency/reference.sql"} <= found
    assert "query_latency/query.sql" not in found and "query_latency/program.md" not in found


def test_training_hashes_its_measuring_files_only() -> None:
    assert [name for name, _ in harness_files("training")] == list(MEASURING_FILES)


@pytest.fixture
def package_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A copy of the ticket-routing package that the task's harness hash reads instead of the real one."""
    origin = Path(profiles.__file__).parent / "tasks" / "ticket_routing"
    copy = tmp_path / "ticket_routing"
    shutil.copytree(origin, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(profiles, "_evaluator_origin", lambda module: copy / "__init__.py")
    return copy


def test_a_new_starter_program_or_sample_keeps_the_hash(package_copy: Path) -> None:
    before = harness_hash("ticket-routing")
    (package_copy / "router.py").write_text("def train(examples):\n    pass\n")
    (package_copy / "program.md").write_text("# another program\n")
    (package_copy / "sample" / "banking77_sample.csv").write_text("text,category\nhello,greeting\n")
    (package_copy / "evaluation.py~").write_text("an editor's backup\n")
    assert harness_hash("ticket-routing") == before


def test_a_changed_evaluator_or_host_changes_the_hash(package_copy: Path) -> None:
    before = harness_hash("ticket-routing")
    host = package_copy / "host.py"
    host.write_text(host.read_text() + "\n# measured differently\n")
    assert harness_hash("ticket-routing") != before
