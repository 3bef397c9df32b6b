"""Configuration: TOML, FOREMAN_<SECTION>__<KEY> overrides, <key>_file secrets, errors that name the key."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from bot.cli import main
from bot.config import ConfigError, Settings, ensure_webhook_secret, load_settings
from bot.core.issue_state import repo_key
from tests.conftest import REPO_ROOT

SECRET = "a-secret-of-sufficient-length"


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "foreman.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_toml_values_are_read_and_env_overrides_win(tmp_path: Path) -> None:
    """TOML first, then FOREMAN_<SECTION>__<KEY> (JSON for lists) on top."""
    path = _write(tmp_path, f'[server]\nport = 9000\n[webhook]\nsecrets = ["{SECRET}"]\n')
    settings = load_settings(
        path,
        environ={"FOREMAN_SERVER__PORT": "9100", "FOREMAN_WEBHOOK__SECRETS": json.dumps([SECRET, SECRET + "2"])},
    )
    assert settings.server.port == 9100
    assert settings.webhook_secrets() == [SECRET.encode(), (SECRET + "2").encode()]


@pytest.mark.parametrize(
    ("text", "env", "key"),
    [
        ("[server]\nport = 'eighty'\n", {}, "server.port"),
        ("[server]\nprot = 1\n", {}, "server.prot"),
        ("[webhook]\npath = 'webhook'\n", {}, "webhook.path"),
        ("[webhook]\nsecrets = ['short']\n", {}, "webhook.secrets.0"),
        ("", {"FOREMAN_WORKER__MAX_ATTEMPTS": "0"}, "worker.max_attempts"),
        ("", {"FOREMAN_WEBHOOK__SECRETS": "[not json"}, "webhook.secrets"),
        ("", {"FOREMAN_GITEA__URL": "gitea.local"}, "gitea.url"),
        ("[roster]\nalice = ['wizard']\n", {}, "roster.alice.0"),
    ],
)
def test_every_config_error_names_the_offending_key(tmp_path: Path, text: str, env: dict[str, str], key: str) -> None:
    """DESIGN 3: config errors name the key."""
    with pytest.raises(ConfigError) as caught:
        load_settings(_write(tmp_path, text), environ=env)
    assert caught.value.key == key


def test_broken_toml_names_the_file(tmp_path: Path) -> None:
    """A syntax error names the file rather than crashing."""
    path = _write(tmp_path, "[server\n")
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    assert caught.value.key == str(path)


def test_secrets_can_come_from_files(tmp_path: Path) -> None:
    """Every secret can be given as <key>_file; the value is never in the repr."""
    (tmp_path / "hook").write_text(f"{SECRET}\n{SECRET}-next\n", encoding="utf-8")
    (tmp_path / "token").write_text("gitea-token-value\n", encoding="utf-8")
    path = _write(
        tmp_path, f'[webhook]\nsecrets_file = "{tmp_path / "hook"}"\n[gitea]\ntoken_file = "{tmp_path / "token"}"\n'
    )
    settings = load_settings(path, environ={})
    assert settings.webhook_secrets() == [SECRET.encode(), f"{SECRET}-next".encode()]
    assert settings.gitea_token() == "gitea-token-value"
    assert "gitea-token-value" not in repr(settings) and SECRET not in repr(settings)


def test_a_missing_secret_file_is_an_error_naming_the_key(tmp_path: Path) -> None:
    """An unreadable secret file is a config error naming <key>_file."""
    path = _write(tmp_path, f'[gitea]\ntoken_file = "{tmp_path / "nope"}"\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    assert caught.value.key == "gitea.token_file"


def test_an_explicitly_empty_secret_list_refuses(tmp_path: Path) -> None:
    """An explicitly empty secret list refuses to start (fail closed)."""
    with pytest.raises(ConfigError) as caught:
        load_settings(_write(tmp_path, "[webhook]\nsecrets = []\n"), environ={})
    assert caught.value.key == "webhook.secrets"


def test_no_secret_configured_generates_one_0600_and_reuses_it(tmp_path: Path) -> None:
    """With no secret configured, one is generated under var/ with mode 0600, then reused."""
    path = _write(tmp_path, f'[database]\npath = "{tmp_path / "var" / "foreman.db"}"\n')
    settings = load_settings(path, environ={})
    assert settings.webhook.secrets is None
    filled, secret_path = ensure_webhook_secret(settings)
    assert secret_path == tmp_path / "var" / "webhook-secret"
    assert stat.S_IMODE(secret_path.stat().st_mode) == 0o600
    assert len(filled.webhook_secrets()[0]) == 64
    again, _ = ensure_webhook_secret(settings)
    assert again.webhook_secrets() == filled.webhook_secrets()


def test_settings_repo_key_is_the_key_every_store_files_the_repository_under() -> None:
    """Gitea names are case-insensitive: the stores key the configured repository by owner/name in lower case."""
    settings = Settings.model_validate({"repository": {"owner": "Acme-Org", "name": "Foreman.Repo"}})
    assert settings.repo_key == "acme-org/foreman.repo"
    assert settings.repo_key == repo_key(f"{settings.repository.owner}/{settings.repository.name}")
    assert Settings().repo_key == "org/repo"


def test_the_shipped_configs_are_valid_and_the_example_documents_every_key() -> None:
    """config/foreman.toml loads; foreman.example.toml names every key of every section."""
    from bot.config import Settings

    load_settings(REPO_ROOT / "config" / "foreman.toml", environ={})
    example = (REPO_ROOT / "config" / "foreman.example.toml").read_text(encoding="utf-8")
    for section, field in Settings.model_fields.items():
        assert f"[{section}]" in example or f"[{section}." in example, section
        annotation = field.annotation
        for key in getattr(annotation, "model_fields", {}):
            documented = (f"\n{key} =", f"# {key} =", f"[{section}.{key}]")
            assert any(form in example for form in documented), f"{section}.{key}"


def test_check_config_reports_ok_and_exit_2_on_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """DESIGN 3: `foreman check-config` validates; a bad config exits 2 naming the key."""
    monkeypatch.delenv("FOREMAN_CONFIG", raising=False)
    good = _write(tmp_path, f'[webhook]\nsecrets = ["{SECRET}"]\n')
    assert main(["check-config", "--config", str(good), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["config"] == "ok" and doc["gitea"]["ok"] is False
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nport = -1\n", encoding="utf-8")
    assert main(["check-config", "--config", str(bad), "--json"]) == 2
    assert json.loads(capsys.readouterr().err)["key"] == "server.port"
    assert main(["check-config", "--config", str(bad)]) == 2  # people get a short summary naming the key
    err = capsys.readouterr().err
    assert err.startswith("foreman check-config: the configuration is not valid (1 problem(s)):\n  server.port: ")
