"""No file of the repository points at a document that is not in it (issue 34 item 3: the design document,
../shared/DESIGN.md, was named by files of the repository as if it were in it; `--help` pointed at docs/ the wheel
did not carry)."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from tests.conftest import REPO_ROOT

#: A document named by its file name (README.md), possibly with a folder before it.
NAMED = re.compile(r"(?<![\w-])((?:[\w.-]+/)*[A-Z][A-Z0-9_-]*\.md)\b")
#: A path into the repository's documents or configs (docs/operating.md, config/foreman.example.toml).
PATH = re.compile(r"(?<![\w./-])((?:docs|config)/[\w./-]*[\w-])")
#: A Markdown link's target.
LINK = re.compile(r"\]\(([^)#\s]+)")
#: Where documents beside the repository are named explicitly (FOREMAN_SHARED; never copied into it).
BESIDE = ("../shared/", "shared/")


def tracked() -> list[Path]:
    names = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, text=True, check=True,
                           timeout=60).stdout.split("\0")
    return [REPO_ROOT / name for name in names if name and (REPO_ROOT / name).is_file()]


def dangling(path: Path, text: str) -> list[str]:
    """Each reference in ``text`` (of the file at ``path``) to a document that is not in the repository."""
    found: list[str] = []
    relative = path.relative_to(REPO_ROOT)
    for number, line in enumerate(text.splitlines(), 1):
        for match in NAMED.finditer(line):
            name = match.group(1)
            if name.startswith(BESIDE) or "shared" in line[: match.start()]:
                continue  # says where it is: beside the repository (../shared/DESIGN.md, shared_dir / "DESIGN.md")
            if "share/gitea-foreman/" in name:
                continue  # where the wheel installs it
            if not ((REPO_ROOT / name).exists() or (path.parent / name).exists()):
                found.append(f"{relative}:{number}: {name}")
        # Test fixtures write docs/... files of their own into scratch repositories: only the project's files count.
        if relative.parts[0] != "tests":
            found += [f"{relative}:{number}: {m.group(1)}" for m in PATH.finditer(line)
                      if not (REPO_ROOT / m.group(1)).exists()]
        if path.suffix == ".md":
            found += [f"{relative}:{number}: ]({m.group(1)})" for m in LINK.finditer(line)
                      if not m.group(1).startswith(("http://", "https://", "mailto:"))
                      and not (path.parent / m.group(1)).exists()]
    return found


def test_every_document_a_file_names_is_in_the_repository() -> None:
    problems: list[str] = []
    for path in tracked():
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary (screenshots)
        problems += dangling(path, text)
    assert problems == [], "\n".join(problems)


def test_the_checker_finds_a_missing_document() -> None:
    here = REPO_ROOT / "docs" / "operating.md"
    missing = "DESIGN" + ".md"  # spelled apart: this file is scanned too
    assert dangling(here, f"see {missing} section 3 and docs/nowhere.md, [x](gone.md)") == [
        f"docs/operating.md:1: {missing}", "docs/operating.md:1: docs/nowhere.md", "docs/operating.md:1: ](gone.md)"]
    assert dangling(here, "see ../shared/DESIGN.md and docs/mcp.md, [x](grants.md), README.md") == []


def test_the_documents_help_names_ship_in_the_wheel() -> None:
    """`foreman --help` and each command's help name docs/*.md: the wheel installs every one of them under
    <prefix>/share/gitea-foreman/docs (pyproject's data-files), and the top-level help says where."""
    from bot.cli import build_parser, docs_dir

    data_files = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"][
        "data-files"]
    assert data_files["share/gitea-foreman/docs"] == ["docs/*.md"]
    named = {m.group(1) for path in (REPO_ROOT / "bot" / "cli").glob("*.py")
             for m in PATH.finditer(path.read_text(encoding="utf-8")) if m.group(1).startswith("docs/")}
    assert named and all(name.endswith(".md") and (REPO_ROOT / name).is_file() for name in named), named
    assert str(docs_dir()).replace(" ", "") in "".join(build_parser().format_help().split())
