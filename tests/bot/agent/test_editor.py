"""The Claude agent's workspace and tools: what an edit does, what is refused, what a submit must pass."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from anthropic.types import ToolTextEditor20250124Param, ToolTextEditor20250728Param

from bot.agent.editor import (
    BAD_CALL,
    HARNESS_SUMMARY,
    HARNESS_USES,
    NOT_APPLIED,
    READ_ONLY,
    SUBMIT_TOOL,
    Submission,
    ToolResult,
    Workspace,
    check_asset,
    editor_tool,
    missing_harness_uses,
    parse_submit,
)

REPO = Path(__file__).resolve().parents[3]
TRAIN_PY = (REPO / "train.py").read_text()
PROGRAM_MD = (REPO / "program.md").read_text()

SMALL = "A = 1\nB = 2\nB = 2\nC = 3\n"


def workspace(asset: str = SMALL) -> Workspace:
    return Workspace(asset, "# program\nLower val_bpb.\n")


def test_view_numbers_the_lines_and_honours_a_range():
    ws = workspace()
    whole = ws.run({"command": "view", "path": "/repo/train.py"})
    assert not whole.is_error
    assert whole.text.splitlines() == ["     1\tA = 1", "     2\tB = 2", "     3\tB = 2", "     4\tC = 3"]
    part = ws.run({"command": "view", "path": "train.py", "view_range": [3, -1]})
    assert part.text.splitlines() == ["     3\tB = 2", "     4\tC = 3"]


def test_view_of_the_workspace_lists_its_files():
    listing = workspace().run({"command": "view", "path": "/repo"}).text
    assert "/repo/train.py" in listing and "/repo/program.md  (read-only)" in listing
    assert "/repo/harness.md  (read-only)" in listing


@pytest.mark.parametrize("path", ["/repo/program.md", "program.md", "/program.md", "./harness.md"])
def test_read_only_files_can_be_read(path):
    result = workspace().run({"command": "view", "path": path})
    assert not result.is_error and "\t" in result.text


def test_str_replace_applies_a_unique_match_and_shows_the_result():
    ws = workspace()
    result = ws.run({"command": "str_replace", "path": "/repo/train.py", "old_str": "A = 1", "new_str": "A = 10"})
    assert not result.is_error
    assert ws.asset == "A = 10\nB = 2\nB = 2\nC = 3\n"
    assert "     1\tA = 10" in result.text


def test_str_replace_without_a_match_changes_nothing():
    ws = workspace()
    result = ws.run({"command": "str_replace", "path": "/repo/train.py", "old_str": "D = 4", "new_str": "D = 5"})
    assert result.error == NOT_APPLIED and "does not occur" in result.text
    assert ws.asset == SMALL


def test_str_replace_with_two_matches_changes_nothing_and_names_the_lines():
    ws = workspace()
    result = ws.run({"command": "str_replace", "path": "/repo/train.py", "old_str": "B = 2", "new_str": "B = 3"})
    assert result.error == NOT_APPLIED and "2 times" in result.text and "lines 2, 3" in result.text
    assert ws.asset == SMALL


@pytest.mark.parametrize(
    "command",
    [
        {"command": "str_replace", "path": "/repo/program.md", "old_str": "Lower", "new_str": "Raise"},
        {"command": "insert", "path": "/repo/harness.md", "insert_line": 0, "insert_text": "x"},
        {"command": "create", "path": "/repo/program.md", "file_text": "new program"},
        {"command": "undo_edit", "path": "/repo/program.md"},
    ],
)
def test_writes_to_anything_but_train_py_are_refused(command):
    ws = workspace()
    result = ws.run(command)
    assert result.error == READ_ONLY and "read-only" in result.text
    assert ws.files["program.md"] == "# program\nLower val_bpb.\n" and ws.asset == SMALL


def test_create_of_a_new_file_is_refused():
    ws = workspace()
    result = ws.run({"command": "create", "path": "/repo/model.py", "file_text": "x = 1"})
    assert result.error == READ_ONLY and "only /repo/train.py may be written" in result.text
    assert set(ws.files) == {"train.py", "program.md", "harness.md"}


def test_create_of_train_py_replaces_it():
    ws = workspace()
    assert not ws.run({"command": "create", "path": "/repo/train.py", "file_text": "X = 1\n"}).is_error
    assert ws.asset == "X = 1\n"


@pytest.mark.parametrize(
    "arguments",
    [
        {"command": "str_replace", "path": "/repo/train.py", "new_str": "x"},  # no old_str
        {"command": "str_replace", "path": "/repo/train.py", "old_str": "", "new_str": "x"},
        {"command": "view", "path": "/repo/train.py", "view_range": [0, 2]},
        {"command": "view", "path": "/repo/train.py", "view_range": "1-2"},
        {"command": "insert", "path": "/repo/train.py", "insert_line": "2", "insert_text": "x"},
        {"command": "view"},  # no path
        {"command": "delete", "path": "/repo/train.py"},
        {"command": "view", "path": "/etc/passwd"},
        "view train.py",
    ],
)
def test_bad_arguments_are_answered_as_malformed_calls(arguments):
    ws = workspace()
    result = ws.run(arguments)
    assert result.error == BAD_CALL and result.text
    assert ws.asset == SMALL


def test_insert_adds_lines_after_the_given_line():
    ws = workspace()
    assert not ws.run(
        {"command": "insert", "path": "/repo/train.py", "insert_line": 1, "insert_text": "A2 = 1.5"}
    ).is_error
    assert ws.asset.splitlines()[:3] == ["A = 1", "A2 = 1.5", "B = 2"]
    assert not ws.run({"command": "insert", "path": "/repo/train.py", "insert_line": 0, "new_str": "# top\n"}).is_error
    assert ws.asset.startswith("# top\nA = 1\n")
    beyond = ws.run({"command": "insert", "path": "/repo/train.py", "insert_line": 99, "insert_text": "x"})
    assert beyond.error == NOT_APPLIED


def test_undo_edit_restores_the_previous_text():
    ws = workspace()
    ws.run({"command": "str_replace", "path": "/repo/train.py", "old_str": "C = 3", "new_str": "C = 4"})
    assert not ws.run({"command": "undo_edit", "path": "/repo/train.py"}).is_error
    assert ws.asset == SMALL
    assert ws.run({"command": "undo_edit", "path": "/repo/train.py"}).error == NOT_APPLIED


# --- submit ------------------------------------------------------------------------------------------


def test_submit_schema_requires_the_four_fields():
    schema = SUBMIT_TOOL["input_schema"]
    assert schema["required"] == ["title", "hypothesis", "expected_effect", "risk"]
    assert schema["properties"]["fixes_failure"]["type"] == "boolean"


def test_parse_submit_reads_the_fields_and_shortens_a_long_title():
    parsed = parse_submit(
        {
            "title": "  Raise   the matrix learning rate " + "and more words " * 10,
            "hypothesis": "h",
            "expected_effect": "-0.01",
            "risk": "divergence",
            "fixes_failure": True,
        }
    )
    assert isinstance(parsed, Submission)
    assert parsed.title.startswith("Raise the matrix learning rate") and len(parsed.title) <= 80
    assert parsed.fixes_failure is True


@pytest.mark.parametrize(
    "arguments",
    [
        {"title": "t", "hypothesis": "h", "expected_effect": "e"},
        {"title": "", "hypothesis": "h", "expected_effect": "e", "risk": "r"},
        {"title": "t", "hypothesis": 3, "expected_effect": "e", "risk": "r"},
        {"title": "t", "hypothesis": "h", "expected_effect": "e", "risk": "r", "fixes_failure": "yes"},
        ["not", "an", "object"],
    ],
)
def test_parse_submit_refuses_missing_or_mistyped_fields(arguments):
    result = parse_submit(arguments)
    assert isinstance(result, ToolResult) and result.error == BAD_CALL


def test_the_repository_train_py_passes_the_submit_checks_once_changed():
    changed = TRAIN_PY.replace("MATRIX_LR = 0.04", "MATRIX_LR = 0.05")
    assert missing_harness_uses(TRAIN_PY) == []
    assert check_asset(changed, main_asset=TRAIN_PY, max_bytes=200_000) is None


@pytest.mark.parametrize(
    "text, kind",
    [
        (TRAIN_PY + "\n   \n", "unchanged"),  # trailing whitespace only: the same code_hash
        (TRAIN_PY.replace("MATRIX_LR = 0.04", "MATRIX_LR = = 0.05"), "does not compile"),
        (TRAIN_PY.replace("h.step_done(train_loss)", "pass"), "harness interface"),
        (TRAIN_PY.replace("from runner import harness", "import harness"), "harness interface"),
        (TRAIN_PY + "\n# " + "x" * 300_000 + "\n", "too large"),
    ],
)
def test_submit_checks_name_what_is_wrong(text, kind):
    problem = check_asset(text, main_asset=TRAIN_PY, max_bytes=200_000)
    assert problem is not None and problem[0] == kind


def test_a_missing_step_report_is_named():
    text = TRAIN_PY.replace("h.step_done(train_loss)", "pass")
    assert missing_harness_uses(text) == ["h.step_done"]


# --- the tool definitions and the harness summary -----------------------------------------------------


def test_the_editor_tool_matches_the_sdk_types():
    tool = editor_tool("claude-sonnet-4-5")
    assert set(tool) <= set(ToolTextEditor20250728Param.__annotations__)
    assert tool == {"type": "text_editor_20250728", "name": "str_replace_based_edit_tool"}
    old = editor_tool("claude-3-7-sonnet-latest")
    assert set(old) <= set(ToolTextEditor20250124Param.__annotations__)
    assert old["name"] == "str_replace_editor"


def test_the_harness_summary_names_only_what_the_harness_has():
    tree = ast.parse((REPO / "runner" / "harness.py").read_text())
    session = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Session")
    members = {n.name for n in session.body if isinstance(n, ast.FunctionDef)}
    members |= {
        t.id for n in ast.walk(session) if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
    }
    members |= {
        t.attr
        for n in ast.walk(session)
        if isinstance(n, (ast.Assign, ast.AnnAssign))
        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
        if isinstance(t, ast.Attribute)
    }
    functions = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    named = set(re.findall(r"\bh\.([a-z_]+)", HARNESS_SUMMARY))
    assert named and named <= members, named - members
    assert "session" in functions and "harness.session()" in HARNESS_SUMMARY
    assert set(HARNESS_USES) - {"session"} <= members
