"""Issue 12.11: `foreman check-config` can fail. Real `python -m bot check-config` processes against the bundled
Gitea emulator: exit 1 with a typed per-check report (also with --json) when Gitea is unreachable, the token is
refused, the repository is missing, the bot lacks write permission on it, or the token is not gitea.bot_login's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.gitea_fixtures import BOT, OWNER, REPO, TOKENS, live_emulator
from tests.serve_support import run_foreman
from tests.support import free_port

pytestmark = [pytest.mark.process]

SECRET = "a-secret-of-sufficient-length"
ENVELOPE_KEYS = {"error", "message", "remediate", "exact_next_action"}


async def check_config(
    tmp_path: Path, *, url: str, token: str, owner: str = OWNER, name: str = REPO, bot_login: str = BOT,
    json_flag: bool = True, more: str = "",
) -> tuple[int, str, str]:
    config = tmp_path / "foreman.toml"
    config.write_text(
        f'[webhook]\nsecrets = ["{SECRET}"]\n[database]\npath = "db/foreman.db"\n'
        f'[gitea]\nurl = "{url}"\ntoken = "{token}"\nbot_login = "{bot_login}"\ntimeout_s = 2.0\n'
        f'[repository]\nowner = "{owner}"\nname = "{name}"\n' + more,
        encoding="utf-8",
    )
    return await run_foreman("check-config", "--config", str(config), *(["--json"] if json_flag else []), cwd=tmp_path)


def _checks(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {check["check"]: check for check in doc["checks"]}


async def test_check_config_passes_every_check_against_a_good_gitea(tmp_path: Path) -> None:
    async with live_emulator() as live:
        code, out, err = await check_config(tmp_path, url=live.base_url, token=TOKENS[BOT])
    assert code == 0, out + err
    doc = json.loads(out)
    assert doc["ok"] is True and doc["config"] == "ok"
    checks = _checks(doc)
    assert [c["status"] for c in doc["checks"]] == ["ok"] * len(doc["checks"])
    assert {"gitea_reachable", "token", "bot_login", "repository", "permission"} <= checks.keys()
    assert checks["permission"]["permission"] == "admin" and doc["gitea"]["login"] == BOT


async def test_check_config_text_output_lists_each_check(tmp_path: Path) -> None:
    async with live_emulator() as live:
        code, out, _ = await check_config(tmp_path, url=live.base_url, token=TOKENS[BOT], json_flag=False)
    assert code == 0
    assert all(name in out for name in ("gitea_reachable", "token", "repository", "permission"))


async def test_check_config_checks_each_identity_token_is_its_logins_account(tmp_path: Path) -> None:
    roster = '[roster]\nalice = ["author"]\nbob = ["reviewer"]\n'
    async with live_emulator() as live:
        good = roster + f'[gitea.identity_tokens]\nalice = "{TOKENS["alice"]}"\nbob = "{TOKENS["bob"]}"\n'
        code, out, err = await check_config(tmp_path, url=live.base_url, token=TOKENS[BOT], more=good)
        assert code == 0, out + err
        assert _checks(json.loads(out))["identity_tokens"]["status"] == "ok"
        swapped = roster + f'[gitea.identity_tokens]\nalice = "{TOKENS["bob"]}"\nbob = "not-a-token"\n'
        code, out, err = await check_config(tmp_path, url=live.base_url, token=TOKENS[BOT], more=swapped)
    assert code == 1, out + err
    check = _checks(json.loads(out))["identity_tokens"]
    assert check["status"] == "failed" and "alice: the token belongs to bob" in check["detail"], check
    assert "bob: Gitea refused its token" in check["detail"] and TOKENS["bob"] not in out


@pytest.mark.parametrize(
    ("case", "failed", "error"),
    [
        ("unreachable", "gitea_reachable", "unavailable"),
        ("bad_token", "token", "not_authorized"),
        ("missing_repo", "repository", "not_found"),
        ("read_only_bot", "permission", "not_authorized"),
        ("other_login", "bot_login", "invalid_input"),
    ],
)
async def test_check_config_fails_typed_when_gitea_says_no(tmp_path: Path, case: str, failed: str, error: str) -> None:
    """Issue 12.11: each of these used to exit 0 ("config": "ok")."""
    async with live_emulator() as live:
        options: dict[str, Any] = {"url": live.base_url, "token": TOKENS[BOT]}
        if case == "unreachable":
            options["url"] = f"http://127.0.0.1:{free_port()}"
        elif case == "bad_token":
            options["token"] = "not-a-token"
        elif case == "missing_repo":
            options["name"] = "no-such-repo"
        elif case == "read_only_bot":
            options.update(token=TOKENS["bob"], bot_login="bob")
        elif case == "other_login":
            options["token"] = TOKENS["alice"]
        code, out, err = await check_config(tmp_path, **options)
    assert code == 1, out + err
    assert "Traceback" not in err
    doc = json.loads(out)
    assert ENVELOPE_KEYS <= doc.keys() and doc["ok"] is False
    assert doc["error"] == error and failed in doc["message"]
    check = _checks(doc)[failed]
    assert check["status"] == "failed" and check["error"] == error and check["detail"] and check["remediate"]
    # What depends on a failed check is reported as skipped, not as passed.
    statuses = [c["status"] for c in doc["checks"]]
    assert statuses.index("failed") == [c["check"] for c in doc["checks"]].index(failed)
    assert "ok" not in statuses[statuses.index("failed") + 1 :]


async def test_check_config_from_an_empty_folder_exits_2_naming_where_it_looked(tmp_path: Path) -> None:
    """Issue 34 item 3: from a folder without config/foreman.toml (no --config, no $FOREMAN_CONFIG) it said "the
    configuration is valid" and exited 0; now exit 2, a short text naming each place it looked (JSON with --json)."""
    code, out, err = await run_foreman("check-config", cwd=tmp_path)
    assert code == 2 and out == "", out + err
    assert err.startswith("foreman check-config: no configuration file found. Looked in:\n"), err
    assert "--config: not given" in err and "$FOREMAN_CONFIG: not set" in err
    assert f"{tmp_path / 'config' / 'foreman.toml'}: does not exist" in err
    assert len(err.splitlines()) < 10 and "{" not in err
    code, out, err = await run_foreman("check-config", "--json", cwd=tmp_path)
    assert code == 2
    doc = json.loads(err)
    assert doc["error"] == "invalid_config" and doc["key"] == "--config"
    assert str(tmp_path / "config" / "foreman.toml") in doc["message"] and len(doc["looked_in"]) == 4


async def test_check_config_failures_print_a_short_summary_without_json(tmp_path: Path) -> None:
    """Issue 34 item 3: a failed check printed ~60 lines of JSON; people now get one line per check, the remedy under
    the failed one, and the verdict; --json keeps the whole document (the tests above)."""
    async with live_emulator() as live:
        code, out, err = await check_config(tmp_path, url=live.base_url, token="not-a-token", json_flag=False)
    assert code == 1, out + err
    lines = out.splitlines()
    assert len(lines) <= 10 and "{" not in out, out
    assert lines[0].startswith("ok       config           the configuration is valid (")
    assert lines[2].startswith("failed   token            Gitea refused the token")
    assert lines[3].strip().startswith("fix: Give gitea.token")
    assert lines[-1] == "1 check(s) failed (exit 1); --json prints the whole report"
