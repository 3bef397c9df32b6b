"""Issue 12.7 (fail closed), CLI parts: numbers at every flag are bounded to int64 (what SQLite and Gitea store),
and --candidates-json of any depth, size or integer is refused typed: exit 1 or 2 with the envelope, never a
traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.cli import main
from bot.cli.allocate import parse_candidates_option
from bot.core.allocator import normalize_candidates
from bot.core.errors import EnvelopeError
from tests.test_cli_lists import ENVELOPE_KEYS, _config, run_cli

pytestmark = [pytest.mark.process]

TOO_BIG = "9223372036854775808"  # 2^63


def _envelope(text: str) -> dict[str, Any]:
    doc = json.loads(text)
    assert isinstance(doc, dict) and ENVELOPE_KEYS <= doc.keys(), doc
    return doc


def test_bootstrap_with_an_issue_number_over_int64_exits_2_in_a_real_process(tmp_path: Path) -> None:
    """Issue 12.7: `foreman bootstrap --issue 9223372036854775808` gave a traceback from SQLite."""
    proc = run_cli("--config", str(_config(tmp_path)), "bootstrap", "--issue", TOO_BIG, "--owner", "author-1",
                   "--json", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    doc = _envelope(proc.stdout)
    assert doc["error"] == "invalid_input" and "--issue" in doc["message"]


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "start", "--issue", TOO_BIG],
        ["run", "start", "--issue", "0"],
        ["bootstrap", "--issue", "-1", "--owner", "author-1"],
        ["outbox", "retry", TOO_BIG],
        ["outbox", "retry", "0"],
        ["outbox", "--limit", TOO_BIG],
        ["outbox", "--limit", "-1"],
        ["deliveries", "--limit", TOO_BIG],
        ["deliveries", "--limit", "0"],
        ["deliveries", "--limit", "1" * 5000],
        ["replay", TOO_BIG],
        ["demo", "--timeout", "nan"],
        ["demo", "--timeout", "inf"],
        ["demo", "--timeout", "0"],
    ],
)
def test_every_numeric_flag_is_bounded_and_refuses_with_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """Issue 12.7: issue numbers, row ids and limits >= 2^63 (or < 1) are refused at the flag."""
    assert main(["--config", str(_config(tmp_path)), *argv]) == 2
    assert _envelope(capsys.readouterr().out)["error"] == "invalid_input"


def test_numbers_at_the_int64_bound_are_taken(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = str(_config(tmp_path))
    assert main(["--config", config, "deliveries", "--limit", "9223372036854775807", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["--config", config, "outbox", "retry", "9223372036854775807"]) == 1
    assert _envelope(capsys.readouterr().out)["error"] == "not_found"
    assert main(["--config", config, "replay", "9223372036854775807"]) == 1
    assert _envelope(capsys.readouterr().out)["error"] == "not_found"


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000,
        '[{"issue_number": ' + "1" * 5_000 + "}]",
        '[{"issue_number": NaN}]',
        '[{"issue_number": 1, "depends_on": [Infinity]}]',
        '{"issue_number": 1, "title": ' + "[" * 3_000 + "]" * 3_000 + "}",
        "not json",
    ],
)
def test_the_cli_candidates_parser_refuses_any_depth_or_integer_typed(text: str) -> None:
    with pytest.raises(EnvelopeError) as caught:
        parse_candidates_option(text)
    assert caught.value.envelope.error == "invalid_input"


def test_the_cli_candidates_parser_reads_a_file_and_refuses_unreadable_ones(tmp_path: Path) -> None:
    good = tmp_path / "good.json"
    good.write_text('[{"issue_number": 5}]', encoding="utf-8")
    assert parse_candidates_option(f"@{good}") == tuple(normalize_candidates('[{"issue_number": 5}]'))
    assert parse_candidates_option(None) is None
    binary = tmp_path / "binary.json"
    binary.write_bytes(b'[{"issue_number": 5, "title": "\xff\xfe"}]')
    for ref in (f"@{binary}", f"@{tmp_path / 'missing.json'}", f"@{tmp_path}", "@/dev/zero"):
        with pytest.raises(EnvelopeError) as caught:
            parse_candidates_option(ref)
        assert caught.value.envelope.error == "invalid_input", ref


def test_allocate_with_deeply_nested_candidates_exits_1_with_the_envelope_in_a_real_process(tmp_path: Path) -> None:
    """Issue 12.7: deeply nested candidates_json raised RecursionError (a traceback) in the CLI."""
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000, encoding="utf-8")
    proc = run_cli("--config", str(_config(tmp_path)), "allocate", "--candidates-json", f"@{path}", "--json",
                   cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    doc = _envelope(proc.stdout)
    assert doc["error"] == "invalid_input" and "nested too deeply" in doc["message"]


def test_allocate_with_an_unreadable_candidates_file_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    binary = tmp_path / "binary.json"
    binary.write_bytes(b"\xff\xfe[]")
    assert main(["--config", str(_config(tmp_path)), "allocate", "--candidates-json", f"@{binary}"]) == 2
    assert _envelope(capsys.readouterr().out)["error"] == "invalid_input"
