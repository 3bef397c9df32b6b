"""docs/architecture.md names files and the functions in them: each named file exists and each ``file (`name`)``
is defined there, so the page cannot drift from the house it describes."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO_ROOT

PAGE = REPO_ROOT / "docs" / "architecture.md"
_PATH = re.compile(r"`((?:bot|handlers|state|tests)/[\w/.]*)`")
_NAMED = re.compile(r"`((?:bot|handlers|state)/[\w/]+\.py)` \(`([\w.]+)`")


def _defined(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def test_every_file_the_page_names_exists() -> None:
    missing = sorted({found for found in _PATH.findall(PAGE.read_text(encoding="utf-8"))
                      if not (REPO_ROOT / found.rstrip("/")).exists()})
    assert missing == []


def test_every_function_the_page_places_in_a_file_is_defined_there() -> None:
    misplaced = sorted(
        f"{file} ({name})"
        for file, name in _NAMED.findall(PAGE.read_text(encoding="utf-8"))
        if (REPO_ROOT / file).exists() and name.split(".")[-1] not in _defined(REPO_ROOT / file)
    )
    assert misplaced == []
