"""Import edges that must not exist: the infrastructure and the pure core never reach into the feature handlers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import REPO_ROOT

#: The composition root: the only modules of bot/ that wire the handlers in.
COMPOSITION_ROOT = frozenset({"bot/app.py", "bot/cli/serve.py"})


def _imported(path: Path, root: Path) -> set[str]:
    """Every module an ``import`` or ``from ... import`` names anywhere in the file (in functions and
    ``if TYPE_CHECKING:`` blocks too), as absolute dotted names (relative imports resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = list(path.relative_to(root).parts[:-1])
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            names.add(module)
            names.update(f"{module}.{alias.name}" if module else alias.name for alias in node.names)
    return names


def _reaches_handlers(path: Path, root: Path = REPO_ROOT) -> list[str]:
    return sorted(name for name in _imported(path, root) if name == "handlers" or name.startswith("handlers."))


def _sources(*patterns: str) -> list[Path]:
    found = sorted({path for pattern in patterns for path in REPO_ROOT.glob(pattern)})
    assert found, f"no source files match {patterns}"
    return found


def test_the_outbox_the_worker_and_the_core_never_import_the_handlers() -> None:
    """The outbox's results reach the issue state through hooks the composition root passes in; the worker runs
    whatever router it is given; the pure core knows no feature."""
    offenders = {
        str(path.relative_to(REPO_ROOT)): _reaches_handlers(path)
        for path in _sources("bot/outbox.py", "bot/worker.py", "bot/core/**/*.py")
    }
    assert {name: found for name, found in offenders.items() if found} == {}


def test_only_the_composition_root_in_bot_imports_the_handlers() -> None:
    """Nothing else in bot/ (nor state/) imports handlers/: a new back edge fails here, naming the file."""
    offenders = {
        name: found
        for path in _sources("bot/**/*.py", "state/**/*.py")
        if (name := str(path.relative_to(REPO_ROOT))) not in COMPOSITION_ROOT and (found := _reaches_handlers(path))
    }
    assert offenders == {}


def test_the_check_sees_lazy_relative_and_type_checking_imports(tmp_path: Path) -> None:
    """The check is not fooled by a lazy import or one kept for the type checker; relative imports resolve."""
    probe = tmp_path / "bot" / "core" / "probe.py"
    probe.parent.mkdir(parents=True)
    probe.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from handlers.issue_state import router\n"
        "def f() -> None:\n    import handlers\n"
        "from . import dispatch\n",
        encoding="utf-8",
    )
    assert _reaches_handlers(probe, tmp_path) == [
        "handlers", "handlers.issue_state", "handlers.issue_state.router"
    ]
    assert "bot.core.dispatch" in _imported(probe, tmp_path)


_SQL = re.compile(
    r"\s*(SELECT\s.*\bFROM\b|SELECT\s+COUNT|INSERT\s+(OR\s+\w+\s+)?INTO\b|UPDATE\s+\w+\s+SET\b|DELETE\s+FROM\b"
    r"|CREATE\s+(TABLE|(UNIQUE\s+)?INDEX)\b|PRAGMA\s+\w)",
    re.DOTALL,
)


def _sql_strings(path: Path) -> list[int]:
    """Lines of string constants that begin like an SQL statement (keywords in capitals, as this code base writes
    them; the first part of a multi-part literal counts)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return sorted(
        node.lineno for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and _SQL.match(node.value)
    )


def test_sql_lives_in_state_only() -> None:
    """Every query is a named store method in state/: no module of bot/ or handlers/ writes SQL or opens SQLite
    itself (aiosqlite may be named for a transaction's type; the emulator keeps no database)."""
    offenders = {
        str(path.relative_to(REPO_ROOT)): found
        for path in _sources("bot/**/*.py", "handlers/**/*.py")
        if (found := [str(line) for line in _sql_strings(path)]
            + sorted(n for n in _imported(path, REPO_ROOT) if n.split(".")[0] == "sqlite3"))
    }
    assert offenders == {}


def test_the_sql_check_sees_a_query(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text('Q = (\n    "SELECT status FROM outbox"\n    " WHERE kind = ?"\n)\nD = "Delete a branch."\n'
                     'I = "INSERT INTO t (a) VALUES (?)"\n', encoding="utf-8")
    assert _sql_strings(probe) == [2, 6]
