"""The packages' layers hold: each package imports only the ones below it (bot/core at the bottom,
bot/app at the top), and runner/ (the harness, which runs beside hostile code) never imports bot/.

Read from the source, every import counts, including those inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# package -> the bot packages it may import (itself always allowed; runner/ always allowed from bot/)
MAY_IMPORT: dict[str, set[str]] = {
    "bot.core": set(),
    "bot.store": {"bot.core"},
    "bot.agent": {"bot.core"},
    "bot.forge": {"bot.core"},
    "bot.runners": {"bot.core"},
    "bot.loop": {"bot.core", "bot.store"},
    "bot.views": {"bot.core", "bot.store", "bot.loop"},
    "bot.github": {"bot.core", "bot.store", "bot.views", "bot.forge"},
    "bot.app": {
        "bot.core",
        "bot.store",
        "bot.loop",
        "bot.views",
        "bot.agent",
        "bot.forge",
        "bot.runners",
        "bot.github",
    },
    "runner": set(),
}

# imports that still run up the layers while the re-lay is under way (issue 17); each is removed as
# it is fixed, and the list must end empty
KNOWN_UPWARD: dict[str, set[str]] = {}


def package_of(module: str) -> str:
    parts = module.split(".")
    return parts[0] if parts[0] == "runner" else ".".join(parts[:2])


def imports_of(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            if node.module == "bot":  # from bot import loop
                found.update(f"bot.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in {"bot", "runner"} and name != "bot"}


def modules() -> list[Path]:
    return sorted(p for top in ("bot", "runner") for p in (ROOT / top).rglob("*.py") if "corpus" not in p.parts)


def test_every_bot_module_belongs_to_a_layer():
    loose = [p.relative_to(ROOT).as_posix() for p in modules() if p.parent == ROOT / "bot" and p.name != "__init__.py"]
    assert loose == [], "a module directly in bot/ belongs in one of its packages"
    for path in modules():
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        assert package_of(module) in MAY_IMPORT or module == "bot.__init__", module


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_a_module_imports_only_the_layers_below_it(path: Path):
    module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
    own = package_of(module)
    if own not in MAY_IMPORT:
        return  # bot/__init__.py
    allowed = MAY_IMPORT[own] | {own} | ({"runner"} if own.startswith("bot") else set())
    wrong = sorted(
        name
        for name in imports_of(path)
        if package_of(name) not in allowed and name not in KNOWN_UPWARD.get(module, ())
    )
    assert wrong == [], f"{module} ({own}) imports {wrong}; it may import only {sorted(allowed)}"


def test_the_known_upward_imports_are_still_there():
    """An entry of KNOWN_UPWARD that was fixed must leave the list."""
    for module, names in KNOWN_UPWARD.items():
        path = ROOT / (module.replace(".", "/") + ".py")
        assert names <= imports_of(path), f"{module} no longer imports {names - imports_of(path)}: remove it"
