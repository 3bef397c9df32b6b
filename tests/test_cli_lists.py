"""Every list-valued CLI option takes every value given or refuses (exit 2); a scalar given twice refuses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from bot.config_writer import write_config
from tests.conftest import REPO_ROOT
from tests.support import HANG_S, offline_config

pytestmark = [pytest.mark.process]

CANDIDATES = json.dumps([{"issue_number": n} for n in (617, 5, 7, 9, 12)])
ENVELOPE_KEYS = {"error", "message", "remediate", "exact_next_action"}


def _config(tmp_path: Path) -> Path:
    return write_config(tmp_path / "foreman.toml", offline_config(tmp_path / "foreman.db",
                                                                  {"roster": {"author-1": ["author"]}}))


def run_cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """A real `python -m bot ...` process (the defect was at the process level: argparse's last flag wins)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FOREMAN_")}
    full_env.update({"PYTHONPATH": str(REPO_ROOT), **(env or {})})
    return subprocess.run(
        [sys.executable, "-m", "bot", *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=HANG_S
    )


def _envelope(text: str) -> dict[str, Any]:
    doc = json.loads(text)
    assert isinstance(doc, dict) and ENVELOPE_KEYS <= doc.keys(), doc
    return doc


def test_repeated_exclude_flags_keep_every_value_in_a_real_process(tmp_path: Path) -> None:
    """`--exclude 617 --exclude 5 --exclude 7` excludes all three (it used to keep only 7 and select
    #617, the protected one)."""
    proc = run_cli(
        "--config", str(_config(tmp_path)), "allocate", "--exclude", "617", "--exclude", "5", "--exclude", "7",
        "--candidates-json", CANDIDATES, "--json", cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["exclusions"]["exclude_issue_numbers"] == [5, 7, 617]
    assert doc["issue_number"] == 9


@pytest.mark.parametrize(
    ("flags", "excluded"),
    [
        (["--exclude", "1", "2", "--exclude", "3"], [1, 2, 3]),
        (["--exclude", "617", "5", "7"], [5, 7, 617]),
        (["--exclude", "5", "--exclude", "5"], [5]),
    ],
)
def test_exclude_takes_values_given_once_or_many_times(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], excluded: list[int]
) -> None:
    """DESIGN 3: list-valued options accept repetition (`--exclude 1 --exclude 2`)."""
    code = main(["--config", str(_config(tmp_path)), "allocate", *flags, "--candidates-json", CANDIDATES, "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["exclusions"]["exclude_issue_numbers"] == excluded


@pytest.mark.parametrize("bad", ["abc", "0", "-3", "9223372036854775808", "1.5", "#5", "", "1" * 5000])
def test_a_bad_exclude_value_refuses_with_exit_2_and_the_envelope(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    """`--exclude abc`, `0`, 2^63 exit 2 with a clear invalid_input envelope, never a subset."""
    code = main(["--config", str(_config(tmp_path)), "allocate", "--exclude", "5", "--exclude", bad, "--json"])
    assert code == 2
    out = capsys.readouterr()
    doc = _envelope(out.out)
    assert doc["error"] == "invalid_input" and "--exclude" in doc["message"]
    assert "Traceback" not in out.err


def test_a_bad_exclude_value_refuses_in_a_real_process_without_a_traceback(tmp_path: Path) -> None:
    proc = run_cli("--config", str(_config(tmp_path)), "allocate", "--exclude", "9223372036854775808", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    doc = _envelope(proc.stdout)
    assert doc["error"] == "invalid_input" and "9223372036854775808" in doc["message"]


@pytest.mark.parametrize(
    "argv",
    [
        ["allocate", "--owner", "author-1", "--owner", "author-2"],
        ["allocate", "--candidates-json", "[]", "--candidates-json", "[]"],
        ["allocate", "--expect-fingerprint", "a", "--expect-fingerprint", "b"],
        ["allocate", "--action", "implement", "--action", "review"],
        ["deliveries", "--status", "failed", "--status", "done"],
        ["deliveries", "--limit", "5", "--limit", "6"],
        ["outbox", "--status", "parked", "--status", "done"],
        ["bootstrap", "--issue", "1", "--issue", "2", "--owner", "author-1"],
        ["bootstrap", "--issue", "1", "--owner", "author-1", "--owner", "author-2"],
        ["run", "start", "--issue", "1", "--issue", "2"],
    ],
)
def test_a_scalar_option_given_twice_refuses_instead_of_keeping_the_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """Never a silent subset: a second value for a one-value option is refused (exit 2)."""
    assert main(["--config", str(_config(tmp_path)), *argv]) == 2
    doc = _envelope(capsys.readouterr().out)
    assert doc["error"] == "invalid_input" and "more than once" in doc["message"]


def test_config_given_at_two_levels_with_different_paths_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other = tmp_path / "other.toml"
    other.write_text(_config(tmp_path).read_text(encoding="utf-8"), encoding="utf-8")
    assert main(["--config", str(_config(tmp_path)), "deliveries", "--config", str(other)]) == 2
    assert _envelope(capsys.readouterr().out)["error"] == "invalid_input"


def test_usage_errors_are_the_envelope_not_argparse_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every refusal is typed: an unknown option or a missing required one exits 2 with the envelope."""
    assert main(["--config", str(_config(tmp_path)), "allocate", "--frobnicate"]) == 2
    assert _envelope(capsys.readouterr().out)["error"] == "invalid_input"
    assert main(["--config", str(_config(tmp_path)), "bootstrap", "--owner", "author-1"]) == 2
    assert "--issue" in _envelope(capsys.readouterr().out)["message"]


def test_cli_allocate_takes_candidates_the_allocator_takes(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`--candidates-json @FILE` holds to its own documented limit (the allocator's), not to one MCP call's."""
    path = tmp_path / "many.json"
    path.write_text(json.dumps([{"issue_number": n} for n in range(1, 1202)]), encoding="utf-8")
    code = main(["--config", str(_config(tmp_path)), "allocate", "--candidates-json", f"@{path}", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out.get("message")
    assert out["issue_number"] == 1


def test_cli_allocate_takes_more_exclusions_than_one_mcp_call_may_state(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    excluded = [str(n) for n in range(1, 1202)]
    candidates = json.dumps([{"issue_number": n} for n in (5, 1201, 1300)])
    code = main(["--config", str(_config(tmp_path)), "allocate", "--exclude", *excluded,
                 "--candidates-json", candidates, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0, out.get("message")
    assert out["issue_number"] == 1300
    assert out["exclusions"]["exclude_issue_numbers"] == list(range(1, 1202))
