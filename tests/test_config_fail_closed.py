"""Configuration fails closed: a bad value is refused naming its key, every error at once, paths per the file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.config import ConfigError, Settings, load_settings
from tests.conftest import REPO_ROOT
from tests.support import HANG_S

pytestmark = [pytest.mark.process]

SECRET = "a-secret-of-sufficient-length"


def _write(folder: Path, text: str, name: str = "foreman.toml") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def _refused(path: Path | None, env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ=env or {})
    return caught.value


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("FOREMAN_")}
    full_env.update({"PYTHONPATH": str(REPO_ROOT), **(env or {})})
    return subprocess.run([sys.executable, "-m", "bot", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=HANG_S)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:3000/api/v1", "http://127.0.0.1:3000/api/v1/", "https://git.example/sub/API/V1"]
)
def test_a_gitea_url_with_api_v1_is_refused_naming_the_key(tmp_path: Path, url: str) -> None:
    """The client adds /api/v1 itself; a URL that has it would call /api/v1/api/v1/..."""
    error = _refused(_write(tmp_path, f'[gitea]\nurl = "{url}"\n'))
    assert error.key == "gitea.url" and "/api/v1" in error.message


def test_a_missing_foreman_config_file_refuses_instead_of_running_on_defaults(tmp_path: Path) -> None:
    """FOREMAN_CONFIG naming a missing file silently ran on the defaults."""
    missing = tmp_path / "nope.toml"
    error = _refused(None, {"FOREMAN_CONFIG": str(missing)})
    assert error.key == "FOREMAN_CONFIG" and str(missing) in error.message
    assert _refused(missing).key == "--config"
    assert _refused(tmp_path).key == "--config"  # a folder is not a config file


def test_a_missing_config_file_exits_2_in_a_real_process(tmp_path: Path) -> None:
    for args, env in ((["deliveries"], {"FOREMAN_CONFIG": str(tmp_path / "nope.toml")}),
                      (["--config", str(tmp_path / "nope.toml"), "deliveries"], {})):
        proc = _cli(*args, cwd=tmp_path, env=env)
        assert proc.returncode == 2 and "Traceback" not in proc.stderr
        doc = json.loads(proc.stderr.strip().splitlines()[-1])
        assert doc["error"] == "invalid_config" and "nope.toml" in doc["message"]
        assert doc["remediate"] and doc["exact_next_action"]
        assert not (tmp_path / "var").exists()


@pytest.mark.parametrize(
    ("text", "env", "key"),
    [
        ("[server]\nport = true\n", {}, "server.port"),
        ("[server]\nshutdown_grace_s = false\n", {}, "server.shutdown_grace_s"),
        ("[worker]\nconcurrency = true\n", {}, "worker.concurrency"),
        ("[webhook]\nmax_body_bytes = true\n", {}, "webhook.max_body_bytes"),
        ("[server]\nlog_json = 1\n", {}, "server.log_json"),
        ("[bootstrap]\nrelease_lease_on_failure = 'no'\n", {}, "bootstrap.release_lease_on_failure"),
        ("[gitea]\ntimeout_s = inf\n", {}, "gitea.timeout_s"),
        ("[server]\nshutdown_grace_s = nan\n", {}, "server.shutdown_grace_s"),
        ("", {"FOREMAN_SERVER__PORT": "true"}, "server.port"),
        ("", {"FOREMAN_SERVER__LOG_JSON": "1"}, "server.log_json"),
        ("[grants.'author.implement']\nexpires_after_s = true\n"
         "calls = [{ tool = 'gitea_release_lease', effect = 'teardown', args = { issue_number = '{issue}' } }]\n",
         {}, "grants.author.implement.expires_after_s"),
    ],
)
def test_a_boolean_where_a_number_is_expected_refuses_instead_of_becoming_1(
    tmp_path: Path, text: str, env: dict[str, str], key: str
) -> None:
    """`port = true` became port 1; a boolean is never a number (nor a number a boolean)."""
    assert _refused(_write(tmp_path, text), env).key == key


def test_every_config_error_is_reported_at_once_each_naming_its_key(tmp_path: Path) -> None:
    """All errors, not only the first; `key` stays the first one's (compatibility)."""
    path = _write(
        tmp_path,
        "[server]\nport = 'eighty'\n[worker]\nmax_attempts = 0\n[gitea]\nurl = 'http://x/api/v1'\n"
        f"token_file = '{tmp_path / 'missing-token'}'\n[webhook]\nsecrets = ['short']\n",
    )
    error = _refused(path, {"FOREMAN_SERVER__HOSTT": "x", "FOREMAN_ROSTER__ALICE": "[not json"})
    keys = [key for key, _ in error.errors]
    assert error.key == keys[0]
    assert {"server.port", "worker.max_attempts", "gitea.url", "gitea.token_file", "webhook.secrets.0",
            "server.hostt", "roster.alice"} <= set(keys), keys


def test_every_error_after_validation_is_reported_too(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        f"[webhook]\nsecrets = ['{SECRET}', 'short', 'also-short']\n"
        "[grants.'author.implement']\ncalls = [{ tool = 'gitea_get_issue_state', effect = 'read' }]\n",
    )
    keys = [key for key, _ in _refused(path).errors]
    assert "webhook.secrets.1" in keys and "webhook.secrets.2" in keys
    assert any(key.startswith("grants.author.implement") for key in keys), keys


def test_the_cli_prints_every_config_error(tmp_path: Path) -> None:
    path = _write(tmp_path, "[server]\nport = true\n[worker]\nmax_attempts = 0\n")
    proc = _cli("--config", str(path), "check-config", "--json", cwd=tmp_path)
    assert proc.returncode == 2
    doc = json.loads(proc.stderr.strip().splitlines()[-1])
    assert doc["key"] == "server.port"
    assert [e["key"] for e in doc["errors"]] == ["server.port", "worker.max_attempts"]
    assert doc["error"] == "invalid_config" and doc["remediate"] and doc["exact_next_action"]


def test_relative_paths_resolve_against_the_config_files_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DESIGN 3 (2026-12): a `foreman mcp` started elsewhere silently made a second, empty database."""
    folder = tmp_path / "etc"
    (folder / "secrets").mkdir(parents=True)
    (folder / "secrets" / "hook").write_text(SECRET + "\n", encoding="utf-8")
    (folder / "secrets" / "token").write_text("tok\n", encoding="utf-8")
    path = _write(
        folder,
        "[database]\npath = 'db/foreman.db'\n[repository]\ncheckout_root = 'checkouts'\n"
        "[webhook]\nsecrets_file = 'secrets/hook'\n[gitea]\ntoken_file = 'secrets/token'\n",
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    settings = load_settings(Path("../etc/foreman.toml"), environ={})
    assert settings.database.path == folder.resolve() / "db" / "foreman.db"
    assert settings.repository.checkout_root == folder.resolve() / "checkouts"
    assert settings.webhook_secrets() == [SECRET.encode()] and settings.gitea_token() == "tok"
    # Defaults the file leaves out live beside it too; absolute paths stay as given.
    bare = load_settings(_write(folder, "", "bare.toml"), environ={"FOREMAN_DATABASE__PATH": str(tmp_path / "a.db")})
    assert bare.repository.checkout_root == folder.resolve() / "var" / "checkouts"
    assert bare.database.path == tmp_path / "a.db"
    assert path.exists()


def test_a_process_started_elsewhere_uses_the_database_beside_its_config(tmp_path: Path) -> None:
    folder = tmp_path / "etc"
    path = _write(folder, f"[webhook]\nsecrets = ['{SECRET}']\n[database]\npath = 'db/foreman.db'\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    proc = _cli("--config", str(path), "deliveries", "--json", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert (folder / "db" / "foreman.db").is_file()
    assert list(elsewhere.iterdir()) == []


def test_the_shipped_config_keeps_its_database_at_the_repository_root() -> None:
    settings = load_settings(REPO_ROOT / "config" / "foreman.toml", environ={})
    assert settings.database.path == REPO_ROOT.resolve() / "var" / "foreman.db"
    assert settings.repository.checkout_root == REPO_ROOT.resolve() / "var" / "checkouts"


def test_without_a_config_file_relative_defaults_stay_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = load_settings(None, environ={})
    assert isinstance(settings, Settings)
    assert settings.database.path.resolve() == (tmp_path / "var" / "foreman.db").resolve()
