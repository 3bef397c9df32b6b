"""`[gitea] identity_tokens` / `identity_token_files`: roster identities' own Gitea tokens, and `client_as`."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest

from bot.config import ConfigError, load_settings
from bot.gitea import GiteaClient, client_as

SECRET = "a-secret-of-sufficient-length"
ROSTER = '[roster]\n"author-1" = ["author"]\n"reviewer-1" = ["reviewer"]\n'


def _write(folder: Path, text: str) -> Path:
    path = folder / "foreman.toml"
    path.write_text(f'[webhook]\nsecrets = ["{SECRET}"]\n' + text, encoding="utf-8")
    return path


def test_identity_tokens_inline_and_from_files_merge_and_are_never_in_the_repr(tmp_path: Path) -> None:
    (tmp_path / "reviewer.token").write_text("tok-reviewer-secret\n", encoding="utf-8")
    path = _write(tmp_path, '[gitea]\ntoken = "tok-bot-secret"\n'
                  '[gitea.identity_tokens]\n"author-1" = "tok-author-secret"\n'
                  '[gitea.identity_token_files]\n"reviewer-1" = "reviewer.token"\n' + ROSTER)
    settings = load_settings(path, environ={})
    assert settings.identity_token("author-1") == "tok-author-secret"
    assert settings.identity_token("Reviewer-1") == "tok-reviewer-secret"  # Gitea logins are case-insensitive
    assert settings.identity_token("someone") is None
    assert "tok-author-secret" not in repr(settings) and "tok-reviewer-secret" not in repr(settings)


def test_bad_identity_tokens_name_their_keys_all_at_once(tmp_path: Path) -> None:
    (tmp_path / "shared.token").write_text("tok-author-secret\n", encoding="utf-8")
    path = _write(tmp_path, '[gitea]\ntoken = "tok-bot-secret"\n'
                  '[gitea.identity_tokens]\n"author-1" = "tok-author-secret"\n"stranger" = "tok-stranger"\n'
                  '"reviewer-1" = "tok-bot-secret"\n'
                  '[gitea.identity_token_files]\n"author-1" = "a.token"\n"merger-1" = "nowhere.token"\n'
                  + ROSTER + '"merger-1" = ["merger"]\n"merger-2" = ["merger"]\n')
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    found = dict(caught.value.errors)
    assert "not both" in found["gitea.identity_token_files.author-1"]
    assert "cannot read" in found["gitea.identity_token_files.merger-1"]
    assert "not a roster identity" in found["gitea.identity_tokens.stranger"]
    assert "bot's gitea.token" in found["gitea.identity_tokens.reviewer-1"]
    assert all("tok-" not in message for _, message in caught.value.errors)  # never a token in an error


def test_a_token_shared_by_two_identities_or_with_spaces_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path, '[gitea.identity_tokens]\n"author-1" = "tok-same"\n"reviewer-1" = "tok-same"\n' + ROSTER)
    with pytest.raises(ConfigError) as caught:
        load_settings(path, environ={})
    assert [key for key, _ in caught.value.errors] == ["gitea.identity_tokens.reviewer-1"]
    assert "author-1's token" in caught.value.errors[0][1]
    spaced = _write(tmp_path, '[gitea.identity_tokens]\n"author-1" = "tok with space"\n' + ROSTER)
    with pytest.raises(ConfigError) as caught:
        load_settings(spaced, environ={})
    assert caught.value.key == "gitea.identity_tokens" and "author-1" in caught.value.message
    assert "tok with space" not in str(caught.value)


async def test_client_as_uses_the_identitys_own_token_else_the_bots_client(tmp_path: Path) -> None:
    path = _write(tmp_path, '[gitea]\ntoken = "tok-bot-secret"\nbot_login = "the-bot"\n'
                  '[gitea.identity_tokens]\n"author-1" = "tok-author-secret"\n' + ROSTER)
    settings = load_settings(path, environ={})
    async with aiohttp.ClientSession() as session:
        bot = GiteaClient(session, base_url="http://gitea.invalid", token="tok-bot-secret", owner="o", repo="r")
        author = client_as(bot, settings, "author-1")
        assert author.own_token and author.login == "author-1" and author.client is not bot
        assert isinstance(author.client, GiteaClient) and author.client.base_url == bot.base_url
        assert author.client._gh.oauth_token == "tok-author-secret"
        reviewer = client_as(bot, settings, "reviewer-1")
        assert (reviewer.client, reviewer.login, reviewer.own_token) == (bot, "the-bot", False)
        fake = object()
        assert client_as(fake, settings, "author-1").client is fake  # not a GiteaClient: it acts as itself
