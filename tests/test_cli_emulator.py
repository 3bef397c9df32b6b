"""`foreman emulator` as a real process: URL, users and tokens, the demo repository, a usable config, SIGTERM."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT
from tests.support import HANG_S

pytestmark = [pytest.mark.process]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FOREMAN_")}
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


def _get(url: str, token: str) -> Any:
    request = urllib.request.Request(url, headers={"Authorization": f"token {token}"})  # noqa: S310 (loopback)
    with urllib.request.urlopen(request, timeout=HANG_S) as resp:  # noqa: S310
        return json.loads(resp.read())


def test_foreman_emulator_prints_what_an_operator_needs_and_serves_it(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "bot", "emulator", "--port", "0", "--json", "--dir",
                             str(tmp_path / "emu")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO_ROOT, env=_env())
    try:
        assert proc.stdout is not None
        ready, _, _ = select.select([proc.stdout], [], [], HANG_S)
        assert ready, f"foreman emulator printed nothing within {HANG_S:.0f} s"
        doc = json.loads(proc.stdout.readline())
        users = {u["login"]: u for u in doc["users"]}
        assert set(users) == {"maintainer", "controller-bot", "author-1", "foreman-bot", "reviewer-1", "merger-1"}
        assert doc["url"].startswith("http://127.0.0.1:") and doc["api"] == doc["url"] + "/api/v1"
        me = _get(f"{doc['api']}/user", users["maintainer"]["token"])
        assert me["login"] == "maintainer"
        repo = _get(f"{doc['api']}/repos/demo/widgets", users["author-1"]["token"])
        assert repo["full_name"] == "demo/widgets"
        labels = {label["name"] for label in _get(f"{doc['api']}/repos/demo/widgets/labels", users["maintainer"]
                                                                                              ["token"])}
        assert {"status:ready", "status:in-progress"} <= labels
        assert Path(doc["config"]).stat().st_mode & 0o077 == 0
        check = subprocess.run([sys.executable, "-m", "bot", "--config", doc["config"], "check-config", "--json"],
                               capture_output=True, text=True, timeout=HANG_S, check=False, cwd=REPO_ROOT, env=_env())
        assert check.returncode == 0, check.stdout + check.stderr
        assert [c["status"] for c in json.loads(check.stdout)["checks"]] == ["ok"] * 7
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            code = proc.wait(HANG_S)
        except subprocess.TimeoutExpired:  # never left running, whatever happened
            proc.kill()
            proc.wait()
            raise
    assert code == 0, proc.stderr.read() if proc.stderr else ""


async def test_the_config_written_for_a_hook_url_serves_where_the_hook_sends(tmp_path: Path) -> None:
    """Issue 34 item 3: `foreman emulator --hook-url ...:8081` wrote a config whose `serve` listened on 8080, with no
    reviewer or merger. Now: the emulator as a real process, its written config served as written, and the hook's
    signed deliveries (a maintainer labelling an issue) reach that foreman and are stored; the roster has a reviewer
    and a merger, each with its own Gitea and MCP token."""
    import asyncio
    import tomllib

    from tests.serve_support import serve_process
    from tests.support import free_port

    hook_port = free_port()
    root = tmp_path / "emu"
    emulator = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bot", "emulator", "--port", "0", "--json", "--dir", str(root),
        "--hook-url", f"http://127.0.0.1:{hook_port}/hooks/gitea", cwd=REPO_ROOT, env=_env(),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert emulator.stdout is not None
        doc = json.loads(await asyncio.wait_for(emulator.stdout.readline(), HANG_S))
        config = tomllib.loads(Path(doc["config"]).read_text(encoding="utf-8"))
        assert config["server"] == {"host": "127.0.0.1", "port": hook_port}
        assert config["webhook"]["path"] == "/hooks/gitea"
        assert config["roster"]["reviewer-1"] == ["reviewer"] and config["roster"]["merger-1"] == ["merger"]
        assert set(config["gitea"]["identity_tokens"]) == {"controller-bot", "author-1", "reviewer-1", "merger-1"}
        assert sorted(config["mcp"]["tokens"].values()) == ["author-1", "controller-bot", "merger-1", "reviewer-1"]
        users = {u["login"]: u["token"] for u in doc["users"]}
        assert {"reviewer-1", "merger-1"} <= users.keys() and set(doc["mcp_tokens"]) == set(config["roster"])
        async with serve_process(root, config=Path(doc["config"]), serve=True) as foreman:
            assert foreman.port == hook_port
            api = f"{doc['api']}/repos/demo/widgets"
            headers = {"Authorization": f"token {users['maintainer']}", "Content-Type": "application/json"}
            loop = asyncio.get_running_loop()

            def post(path: str, body: dict[str, Any]) -> Any:
                request = urllib.request.Request(  # noqa: S310 (loopback)
                    f"{api}{path}", data=json.dumps(body).encode(), headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=HANG_S) as resp:  # noqa: S310 (loopback)
                    return json.loads(resp.read())

            issue = await loop.run_in_executor(None, post, "/issues", {"title": "hooked"})
            labels = {label["name"]: label["id"] for label in _get(f"{api}/labels", users["maintainer"])}
            await loop.run_in_executor(None, post, f"/issues/{issue['number']}/labels",
                                       {"labels": [labels["status:ready"]]})
            await foreman.wait_for(
                lambda: foreman.rows("SELECT count(*) FROM deliveries WHERE event = 'issues'")[0][0] >= 2,
                "the hook's deliveries stored by the foreman serving the written config")
            assert foreman.rows("SELECT count(*) FROM deliveries WHERE status = 'failed'")[0][0] == 0
    finally:
        if emulator.returncode is None:
            emulator.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(emulator.wait(), HANG_S)
            except TimeoutError:  # never left running, whatever happened
                emulator.kill()
                await emulator.wait()
