"""`foreman` as real processes: --version, the listings over the demo's state, help, one line per refusal."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from bot.cli import build_parser
from bot.cli.mcp import MCP_REFUSED_CODE
from tests.conftest import REPO_ROOT
from tests.support import HANG_S
from tests.test_mcp_stdio import foreman_mcp_command, mcp_config

pytestmark = [pytest.mark.process]

PIPE_LINE = "foreman: standard output was closed before the output was written (broken pipe)"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOREMAN_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    env.update(extra)
    return env


def foreman(*args: str, timeout: float = HANG_S) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "bot", *args], capture_output=True, text=True, timeout=timeout,
                          check=False, cwd=REPO_ROOT, env=_env())


@pytest.fixture(scope="module")
def demo_config() -> Iterator[Path]:
    """The demo's kept files: one issue leased, bootstrapped, locked, published, reviewed, merged, torn down."""
    import bot.demo

    out = io.StringIO()
    assert asyncio.run(bot.demo.run_demo(out, keep=True, timeout_s=30)) == 0, out.getvalue()
    found = re.search(r"files kept in (\S+) \(", out.getvalue())
    assert found, out.getvalue()
    root = Path(found.group(1))
    yield root / "foreman.toml"
    shutil.rmtree(root, ignore_errors=True)


def test_version_is_the_installed_distribution() -> None:
    done = foreman("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"foreman {metadata.version('gitea-foreman')}"


def _parsers(parser: argparse.ArgumentParser, path: str = "foreman") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def test_every_command_and_option_has_help() -> None:
    missing = []
    for path, parser in _parsers(build_parser()):
        for action in parser._actions:
            if action.help == argparse.SUPPRESS:
                continue
            if isinstance(action, argparse._SubParsersAction):
                missing += [f"{path} {c.dest}" for c in action._choices_actions if not c.help]
            elif not action.help:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    assert missing == []


def test_top_level_help_lists_every_command() -> None:
    done = foreman("--help")
    assert done.returncode == 0, done.stderr
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    listed = set(re.findall(r"^    (\S+)", done.stdout, re.MULTILINE))
    assert set(sub.choices) <= listed, set(sub.choices) - listed
    assert {"leases", "journal", "issue", "emulator", "demo", "bootstrap", "invariants"} <= set(sub.choices)
    assert "Exit codes: 0" in done.stdout


def test_leases_journal_and_issue_over_the_demo_state(demo_config: Path) -> None:
    leases = foreman("--config", str(demo_config), "leases", "--json")
    assert leases.returncode == 0, leases.stderr
    doc = json.loads(leases.stdout)
    merge, review, lease = doc["recent"]  # newest first: the queues leased the review, then the merge
    assert (lease["issue_number"], lease["owner"], lease["role"], lease["action"], lease["status"]) == (
        1, "author-1", "author", "implement", "released")
    assert (review["issue_number"], review["owner"], review["action"], review["status"]) == (
        1, "reviewer-1", "review", "released")
    assert (merge["issue_number"], merge["owner"], merge["action"], merge["status"], merge["end_reason"]) == (
        1, "merger-1", "merge", "released", "merged")
    assert doc["live"] == [] and lease["end_reason"] == "pull_request_opened"  # the hand-over to review
    text = foreman("--config", str(demo_config), "leases")
    assert text.returncode == 0 and lease["lease_id"] in text.stdout and "author-1" in text.stdout
    assert foreman("--config", str(demo_config), "leases", "--live").stdout.strip() == "(no leases)"

    journal = foreman("--config", str(demo_config), "journal", "--json")
    assert journal.returncode == 0, journal.stderr
    (transition,) = json.loads(journal.stdout)
    phases = [p["phase"] for p in transition["phases"]]
    assert phases[0] == "accepted" and phases[-1] == "completed" and transition["outcome"] == "completed"
    one = foreman("--config", str(demo_config), "journal", transition["idempotency_key"])
    assert one.returncode == 0 and "lock_established" in one.stdout and '"head_sha"' in one.stdout, one.stdout
    unknown = foreman("--config", str(demo_config), "journal", "no-such-key")
    assert unknown.returncode == 1 and json.loads(unknown.stdout)["error"] == "not_found"

    issue = foreman("--config", str(demo_config), "issue", "1", "--json")
    assert issue.returncode == 0, issue.stderr
    doc = json.loads(issue.stdout)
    kinds = {item["kind"] for item in doc["timeline"]}
    assert {"delivery", "lease", "bootstrap", "outbox", "worktree"} <= kinds, kinds
    assert [w["branch"] for w in doc["worktrees"]] == [transition["branch"]]
    text = foreman("--config", str(demo_config), "issue", "1")
    assert text.returncode == 0 and text.stdout.startswith("#1 in demo/widgets: state ")
    assert len(text.stdout.splitlines()) == len(doc["timeline"]) + 1
    nothing = foreman("--config", str(demo_config), "issue", "404")
    assert nothing.returncode == 1 and json.loads(nothing.stdout)["error"] == "not_found"


def test_a_closed_pipe_ends_with_one_line_and_exit_1(demo_config: Path) -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before foreman writes (as `foreman leases | head -0`)
    try:
        done = subprocess.run([sys.executable, "-m", "bot", "--config", str(demo_config), "issue", "1"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=HANG_S, check=False,
                              cwd=REPO_ROOT, env=_env())
    finally:
        os.close(write_end)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [PIPE_LINE]


def test_a_taken_port_ends_with_one_line_and_exit_2(tmp_path: Path) -> None:
    config = mcp_config(tmp_path)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        done = subprocess.run([sys.executable, "-m", "bot", "--config", str(config), "serve"], capture_output=True,
                              text=True, timeout=HANG_S, check=False, cwd=REPO_ROOT,
                              env=_env(FOREMAN_SERVER__PORT=str(port)))
        emulator = foreman("emulator", "--port", str(port), "--dir", str(tmp_path / "emu"))
    for run, key in ((done, "server.port"), (emulator, "--port")):
        assert run.returncode == 2, run.stderr
        assert "Traceback" not in run.stderr and run.stdout == ""
        refusal = json.loads(run.stderr.strip().splitlines()[-1])
        assert (refusal["error"], refusal["key"]) == ("unavailable", key), refusal
        assert f"127.0.0.1:{port}" in refusal["message"] and refusal["exact_next_action"]


async def test_a_bad_mcp_token_is_the_answer_an_mcp_client_shows(tmp_path: Path) -> None:
    config = mcp_config(tmp_path)
    command, *args = foreman_mcp_command(config)
    params = StdioServerParameters(command=command, args=args, env={"FOREMAN_MCP_TOKEN": "wrong-token"},
                                   cwd=REPO_ROOT)
    with (tmp_path / "stderr.log").open("w+") as errlog:
        refused: MCPError | None = None
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as session:
            try:
                await asyncio.wait_for(session.initialize(), HANG_S)
            except MCPError as exc:  # what the client shows its user
                refused = exc
        errlog.seek(0)
        stderr = errlog.read()
    assert refused is not None, "initialize succeeded with a wrong token"
    error = refused.error
    assert error.code == MCP_REFUSED_CODE
    assert "FOREMAN_MCP_TOKEN" in error.message and error.message.startswith("invalid_config: ")
    assert isinstance(error.data, dict) and error.data["exact_next_action"]
    assert "Traceback" not in stderr


def test_a_bad_mcp_token_on_the_raw_wire_answers_the_first_request_then_exits_2(tmp_path: Path) -> None:
    config = mcp_config(tmp_path)
    client = {"name": "raw", "version": "0"}
    init = {"jsonrpc": "2.0", "id": 7, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": client}}
    done = subprocess.run(foreman_mcp_command(config), input=json.dumps(init) + "\n", capture_output=True, text=True,
                          timeout=HANG_S, check=False, cwd=REPO_ROOT, env=_env(FOREMAN_MCP_TOKEN="wrong-token"))
    assert done.returncode == 2, done.stderr
    (answer,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert answer["id"] == 7 and answer["error"]["code"] == MCP_REFUSED_CODE
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and json.loads(lines[0])["key"] == "mcp.tokens"
