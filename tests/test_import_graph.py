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


# --- import circles and the door --------------------------------------------------------------------------------------

#: The packages whose modules may not import each other in a circle; the emulator may keep its own inside itself.
_CIRCLE_FREE = ("bot", "handlers", "state")
_CIRCLE_EXEMPT = ("bot/emulator/",)


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path = REPO_ROOT) -> dict[str, set[str]]:
    """Module → the modules of the house it imports (anywhere in the file: lazy and type-checking imports count,
    as a circle through them is a circle of knowledge all the same); ``from package import name`` names the
    submodule when ``name`` is one, else the package."""
    paths = [path for package in _CIRCLE_FREE for path in sorted((root / package).rglob("*.py"))]
    modules = {_module_name(path, root): path for path in paths}

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets.update(filter(None, (known(alias.name) for alias in node.names)))
            elif isinstance(node, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
                module = ".".join([*base, *([node.module] if node.module else [])])
                for alias in node.names:
                    target = f"{module}.{alias.name}" if f"{module}.{alias.name}" in modules else known(module)
                    if target is not None:
                        targets.add(target)
        targets.discard(name)
        graph[name] = targets
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_circle_in_the_house_outside_the_emulator() -> None:
    """bot/, handlers/ and state/ import downward only: no two modules reach each other by imports (lazy ones
    included), except inside the emulator's own package."""
    exempt = tuple(prefix.rstrip("/").replace("/", ".") for prefix in _CIRCLE_EXEMPT)
    found = [c for c in circles(import_graph()) if not all(m.startswith(exempt) for m in c)]
    assert found == []


def test_the_door_imports_no_verb() -> None:
    """The verbs register with the door; the door (bot/verbs/runtime.py) imports none of them, not even lazily."""
    verbs = {name for name in import_graph() if name.startswith("bot.verbs.")} - {"bot.verbs.runtime"}
    assert sorted(import_graph()["bot.verbs.runtime"] & verbs) == []


def test_the_circle_check_finds_a_lazy_circle(tmp_path: Path) -> None:
    """A circle closed by an import inside a function, or through a package's face, is found; a chain is not."""
    package = tmp_path / "bot"
    (package / "verbs").mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    (package / "verbs" / "__init__.py").write_text("from bot.verbs.b import B\n", encoding="utf-8")
    (package / "verbs" / "a.py").write_text("def f() -> None:\n    from bot.verbs import b\n", encoding="utf-8")
    (package / "verbs" / "b.py").write_text("from . import c\nB = 1\n", encoding="utf-8")
    (package / "verbs" / "c.py").write_text("X = 1\n", encoding="utf-8")
    (package / "verbs" / "d.py").write_text("from bot.verbs.a import f\n", encoding="utf-8")
    for other in ("handlers", "state"):
        (tmp_path / other).mkdir()
    graph = import_graph(tmp_path)
    assert graph["bot.verbs.a"] == {"bot.verbs.b"} and graph["bot.verbs"] == {"bot.verbs.b"}
    assert circles(graph) == []
    (package / "verbs" / "c.py").write_text("import bot.verbs.d\n", encoding="utf-8")
    assert circles(import_graph(tmp_path)) == [["bot.verbs.a", "bot.verbs.b", "bot.verbs.c", "bot.verbs.d"]]


def test_every_lease_is_granted_by_one_function() -> None:
    """Only bot/verbs/leasing.py (``grant_lease``) calls the lease store's ``acquire``: the allocation, a reviewer's
    claim and the hand-back of requested changes all grant through it."""
    callers = {
        str(path.relative_to(REPO_ROOT))
        for path in _sources("bot/**/*.py", "handlers/**/*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "acquire"
        and ("lease" in (held := ast.unparse(node.func.value).lower()) or held == "store")
    }
    assert callers == {"bot/verbs/leasing.py"}


def test_every_outbox_intent_the_product_builds_names_its_repository() -> None:
    """An outbox entry is filed under the repository its intent names (no task-wide "acting for" any more): every
    ``OutboxIntent(...)`` in bot/, handlers/ and state/ passes ``repo=``."""
    unnamed = [
        f"{path.relative_to(REPO_ROOT)}:{node.lineno}"
        for path in _sources("bot/**/*.py", "handlers/**/*.py", "state/**/*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "OutboxIntent"
        and not any(keyword.arg == "repo" for keyword in node.keywords)
    ]
    assert unnamed == []
