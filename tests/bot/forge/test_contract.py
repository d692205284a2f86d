"""The Forge contract, scenario by scenario, on the local git forge and on the forge in memory: the
loop must not be able to tell them apart. Only the protocol is used here (and each forge's way of
naming a commit's parent); what only git on disk has (the working tree, reflogs, tags) is
tests/bot/forge/test_local.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.core.protocols import Forge, ForgeError, MainMoved, MergeConflict
from bot.forge.local import LocalForge, init_research_repo
from bot.forge.memory import MemoryForge

TRAIN_PY = "".join(f"SETTING_{i} = {i}\n" for i in range(1, 11))
PROGRAM_MD = "# program\nMake val_bpb go down.\n"
PREPARE_PY = "# fixed data preparation\n"
FILES = {"train.py": TRAIN_PY, "program.md": PROGRAM_MD, "prepare.py": PREPARE_PY}


def edit_line(text: str, number: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    lines[number - 1] = new + "\n"
    return "".join(lines)


@pytest.fixture(params=["local", "memory"])
def forge(request: pytest.FixtureRequest, tmp_path: Path) -> LocalForge | MemoryForge:
    if request.param == "local":
        return init_research_repo(tmp_path / "research", FILES)
    return MemoryForge(FILES)


def parent(forge: LocalForge | MemoryForge, sha: str) -> str | None:
    if isinstance(forge, LocalForge):
        parents = forge.repo.commit(sha).parents
        return parents[0].hexsha if parents else None
    return forge.parent(sha)


def test_both_are_forges(forge: Forge) -> None:
    assert isinstance(forge, Forge)


def test_a_branch_is_one_commit_on_its_base_and_main_stays(forge: LocalForge | MemoryForge) -> None:
    main = forge.main_sha()
    new_train = edit_line(TRAIN_PY, 3, "SETTING_3 = 33")

    head = forge.create_branch("autoresearch/1-three", main, {"train.py": new_train}, "Three")

    assert parent(forge, head) == main
    assert forge.branch_head("autoresearch/1-three") == head
    assert forge.read_file("autoresearch/1-three", "train.py") == new_train
    assert forge.read_file(head, "program.md") == PROGRAM_MD
    assert forge.main_sha() == main
    assert forge.read_file("main", "train.py") == TRAIN_PY


def test_a_branch_made_twice_is_the_same_commit_and_a_different_one_moves(forge: LocalForge | MemoryForge) -> None:
    main = forge.main_sha()
    files = {"train.py": edit_line(TRAIN_PY, 5, "SETTING_5 = 55")}
    first = forge.create_branch("autoresearch/2-five", main, files, "Five")
    assert forge.create_branch("autoresearch/2-five", main, files, "Five") == first

    moved = forge.create_branch("autoresearch/2-five", main, {"train.py": "A = 2\n"}, "Five")

    assert moved != first
    assert parent(forge, moved) == main
    assert forge.read_file("autoresearch/2-five", "train.py") == "A = 2\n"


def test_main_bad_paths_unknown_refs_and_missing_files_are_refused(forge: LocalForge | MemoryForge) -> None:
    main = forge.main_sha()
    with pytest.raises(ForgeError):
        forge.create_branch("main", main, {"train.py": "x\n"}, "no")
    with pytest.raises(ForgeError):
        forge.create_branch("autoresearch/3-escape", main, {"../outside.py": "x\n"}, "no")
    with pytest.raises(ForgeError):
        forge.create_branch("autoresearch/3 space", main, {"train.py": "x\n"}, "no")
    with pytest.raises(ForgeError):
        forge.read_file("no-such-ref", "train.py")
    with pytest.raises(FileNotFoundError):
        forge.read_file("main", "nope.py")
    assert forge.branch_head("autoresearch/3-escape") is None
    assert forge.main_sha() == main


def test_merge_squashes_the_branch_onto_main_once(forge: LocalForge | MemoryForge) -> None:
    main = forge.main_sha()
    new_train = edit_line(TRAIN_PY, 2, "SETTING_2 = 22")
    head = forge.create_branch("autoresearch/4-two", main, {"train.py": new_train}, "Two")

    new_main = forge.merge("autoresearch/4-two", main, "Keep two")

    assert forge.main_sha() == new_main != head
    assert parent(forge, new_main) == main
    assert forge.read_file("main", "train.py") == new_train
    assert forge.merge("autoresearch/4-two", main, "Keep two") == new_main  # a retry
    assert forge.branch_head("autoresearch/4-two") == head


def test_merge_on_a_main_that_moved_raises_and_changes_nothing(forge: LocalForge | MemoryForge) -> None:
    old_main = forge.main_sha()
    forge.create_branch("autoresearch/5-a", old_main, {"train.py": edit_line(TRAIN_PY, 1, "SETTING_1 = 11")}, "a")
    b_head = forge.create_branch(
        "autoresearch/6-b", old_main, {"train.py": edit_line(TRAIN_PY, 9, "SETTING_9 = 99")}, "b"
    )
    new_main = forge.merge("autoresearch/5-a", old_main, "Keep a")

    with pytest.raises(MainMoved):
        forge.merge("autoresearch/6-b", old_main, "Keep b")
    with pytest.raises(MainMoved):
        forge.merge("autoresearch/6-b", new_main, "Keep b")

    assert forge.main_sha() == new_main
    assert forge.branch_head("autoresearch/6-b") == b_head


def test_rebase_regrafts_only_the_file_and_merges_changes_to_different_lines(forge: LocalForge | MemoryForge) -> None:
    main = forge.main_sha()
    first_train = edit_line(TRAIN_PY, 2, "SETTING_2 = 20")
    forge.create_branch("autoresearch/7-two", main, {"train.py": first_train}, "Two")
    second = forge.create_branch(
        "autoresearch/8-eight",
        main,
        {"train.py": edit_line(TRAIN_PY, 8, "SETTING_8 = 80"), "prepare.py": "# tampered\n"},
        "Eight",
    )
    new_main = forge.merge("autoresearch/7-two", main, "Keep two")

    rebased = forge.rebase_branch("autoresearch/8-eight", new_main, "train.py")

    assert rebased != second
    assert parent(forge, rebased) == new_main
    assert forge.read_file(rebased, "train.py") == edit_line(first_train, 8, "SETTING_8 = 80")
    assert forge.read_file(rebased, "prepare.py") == PREPARE_PY
    assert forge.rebase_branch("autoresearch/8-eight", new_main, "train.py") == rebased
    assert forge.read_file(forge.merge("autoresearch/8-eight", new_main, "Keep eight"), "train.py") == edit_line(
        first_train, 8, "SETTING_8 = 80"
    )


def test_rebase_of_overlapping_edits_conflicts_and_leaves_the_branch(forge: LocalForge | MemoryForge) -> None:
    main = forge.main_sha()
    forge.create_branch("autoresearch/9-up", main, {"train.py": edit_line(TRAIN_PY, 6, "SETTING_6 = 600")}, "up")
    down = forge.create_branch("autoresearch/10-down", main, {"train.py": edit_line(TRAIN_PY, 6, "SETTING_6 = 0")}, "d")
    new_main = forge.merge("autoresearch/9-up", main, "Keep up")

    with pytest.raises(MergeConflict):
        forge.rebase_branch("autoresearch/10-down", new_main, "train.py")

    assert forge.branch_head("autoresearch/10-down") == down


def test_close_is_idempotent_keeps_the_branch_and_lists_in_natural_order(forge: LocalForge | MemoryForge) -> None:
    main = forge.main_sha()
    for name in ("autoresearch/12-raise-lr", "autoresearch/2-smaller-batch", "autoresearch/1-warmup"):
        forge.create_branch(name, main, {"train.py": f"# {name}\n"}, name)
    assert forge.closed_label("autoresearch/2-smaller-batch") is None

    forge.close("autoresearch/2-smaller-batch", "discard")
    forge.close("autoresearch/2-smaller-batch", "discard")

    assert forge.closed_label("autoresearch/2-smaller-batch") == "discard"
    assert forge.list_branches() == [
        "autoresearch/1-warmup",
        "autoresearch/2-smaller-batch",
        "autoresearch/12-raise-lr",
    ]
    assert forge.list_branches("autoresearch/1") == ["autoresearch/1-warmup", "autoresearch/12-raise-lr"]
    with pytest.raises(ForgeError):
        forge.close("autoresearch/no-such-branch", "discard")
