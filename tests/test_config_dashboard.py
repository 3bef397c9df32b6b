"""`[dashboard] token` / `token_file` and `[mcp] token_files` : secrets from files."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.config import ConfigError, load_settings


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_dashboard_is_off_without_a_token(tmp_path: Path) -> None:
    settings = load_settings(_write(tmp_path / "f.toml", ""), environ={})
    assert settings.dashboard.token is None


def test_dashboard_token_from_a_file_relative_to_the_config(tmp_path: Path) -> None:
    _write(tmp_path / "dash.token", "d" * 32 + "\n")
    config = _write(tmp_path / "f.toml", '[dashboard]\ntoken_file = "dash.token"\n')
    settings = load_settings(config, environ={})
    assert settings.dashboard.token is not None and settings.dashboard.token.get_secret_value() == "d" * 32


def test_dashboard_token_from_the_environment(tmp_path: Path) -> None:
    config = _write(tmp_path / "f.toml", "")
    settings = load_settings(config, environ={"FOREMAN_DASHBOARD__TOKEN": "e" * 20})
    assert settings.dashboard.token is not None and settings.dashboard.token.get_secret_value() == "e" * 20


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ('[dashboard]\ntoken = "short"\n', "dashboard.token"),
        ('[dashboard]\ntoken_file = "missing.token"\n', "dashboard.token_file"),
        ('[dashboard]\ntoken = "aaaaaaaaaaaaaaaaaaaa"\ntoken_file = "x"\n', "dashboard.token_file"),
    ],
)
def test_bad_dashboard_tokens_name_their_key(tmp_path: Path, body: str, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(_write(tmp_path / "f.toml", body), environ={})
    assert key in [k for k, _ in caught.value.errors], caught.value.errors


def test_mcp_tokens_from_files_merge_with_inline_tokens(tmp_path: Path) -> None:
    _write(tmp_path / "author.token", "tok-from-file\n")
    config = _write(
        tmp_path / "f.toml",
        '[mcp.tokens]\n"tok-inline" = "controller-bot"\n[mcp.token_files]\n"author-1" = "author.token"\n',
    )
    settings = load_settings(config, environ={})
    assert settings.mcp.tokens == {"tok-inline": "controller-bot", "tok-from-file": "author-1"}


def test_mcp_token_file_that_is_missing_or_shared_is_refused(tmp_path: Path) -> None:
    _write(tmp_path / "a.token", "tok-inline\n")
    config = _write(
        tmp_path / "f.toml",
        '[mcp.tokens]\n"tok-inline" = "controller-bot"\n'
        '[mcp.token_files]\n"author-1" = "a.token"\n"author-2" = "nowhere.token"\n',
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(config, environ={})
    keys = [k for k, _ in caught.value.errors]
    assert keys == ["mcp.token_files.author-1", "mcp.token_files.author-2"], caught.value.errors
