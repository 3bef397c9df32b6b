"""Every list-valued config key, from TOML or a FOREMAN_<SECTION>__<KEY> JSON value, takes all or refuses the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.config import ConfigError, Settings, load_settings

SECRET = "a-secret-of-sufficient-length"


def _load(tmp_path: Path, text: str = "", env: dict[str, str] | None = None) -> Settings:
    path = tmp_path / "foreman.toml"
    path.write_text(text, encoding="utf-8")
    return load_settings(path, environ=env or {})


def _refused(tmp_path: Path, text: str = "", env: dict[str, str] | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as caught:
        _load(tmp_path, text, env)
    return caught.value


def test_every_list_valued_key_is_known_to_this_audit() -> None:
    """If a list-valued key is added, this audit (and its tests below) must be extended."""
    found = set()
    for section, field in Settings.model_fields.items():
        for key, sub in getattr(field.annotation, "model_fields", {}).items():
            if "list[" in str(sub.annotation):
                found.add(f"{section}.{key}")
        if "list[" in str(field.annotation):
            found.add(section)
    assert found == {
        "webhook.secrets", "allocator.priority_labels", "allocator.protected_issues", "allocator.protected_labels",
        "roster", "repositories", "mcp.token_digests", "mcp.allowed_origins", "allocator.queues",
        "merge.require_status",
    }


@pytest.mark.parametrize(
    ("env", "key"),
    [
        # a scalar where a list is expected
        ({"FOREMAN_WEBHOOK__SECRETS": SECRET}, "webhook.secrets"),
        ({"FOREMAN_ALLOCATOR__PROTECTED_ISSUES": "617"}, "allocator.protected_issues"),
        ({"FOREMAN_ALLOCATOR__PROTECTED_ISSUES": "617,618"}, "allocator.protected_issues"),
        ({"FOREMAN_ALLOCATOR__PRIORITY_LABELS": "priority:p0"}, "allocator.priority_labels"),
        ({"FOREMAN_ALLOCATOR__PRIORITY_LABELS": '"priority:p0"'}, "allocator.priority_labels"),
        ({"FOREMAN_ALLOCATOR__PROTECTED_LABELS": "{}"}, "allocator.protected_labels"),
        ({"FOREMAN_ROSTER__ALICE": "author"}, "roster.alice"),
        ({"FOREMAN_MERGE__REQUIRE_STATUS": "ci/build"}, "merge.require_status"),
        # a list with a bad element
        ({"FOREMAN_ALLOCATOR__PROTECTED_ISSUES": '[617, "x"]'}, "allocator.protected_issues.1"),
        ({"FOREMAN_ALLOCATOR__PROTECTED_ISSUES": '[617, "618"]'}, "allocator.protected_issues.1"),
        ({"FOREMAN_ALLOCATOR__PROTECTED_ISSUES": "[617, true]"}, "allocator.protected_issues.1"),
        ({"FOREMAN_ALLOCATOR__PROTECTED_ISSUES": "[617, 618.0]"}, "allocator.protected_issues.1"),
        ({"FOREMAN_ALLOCATOR__PROTECTED_ISSUES": "[617, 0]"}, "allocator.protected_issues.1"),
        ({"FOREMAN_ALLOCATOR__PROTECTED_ISSUES": "[617, 9223372036854775808]"}, "allocator.protected_issues.1"),
        ({"FOREMAN_ALLOCATOR__PROTECTED_ISSUES": "[617, NaN]"}, "allocator.protected_issues"),
        ({"FOREMAN_ALLOCATOR__PRIORITY_LABELS": '["priority:p0", ""]'}, "allocator.priority_labels.1"),
        ({"FOREMAN_ALLOCATOR__PROTECTED_LABELS": '["keep", 5]'}, "allocator.protected_labels.1"),
        ({"FOREMAN_WEBHOOK__SECRETS": json.dumps([SECRET, 12345678901234567890])}, "webhook.secrets.1"),
        ({"FOREMAN_ROSTER__ALICE": '["author", "wizard"]'}, "roster.alice.1"),
        # a table given twice the same key, where one of the two would silently win
        ({"FOREMAN_MCP__TOKENS": '{"tok": "alice", "tok": "bob"}'}, "mcp.tokens"),
    ],
)
def test_a_list_from_the_environment_takes_every_element_or_refuses_naming_the_key(
    tmp_path: Path, env: dict[str, str], key: str
) -> None:
    assert _refused(tmp_path, env=env).key == key


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[allocator]\nprotected_issues = 617\n", "allocator.protected_issues"),
        ("[allocator]\nprotected_issues = [617, true]\n", "allocator.protected_issues.1"),
        ("[allocator]\nprotected_issues = [617, 618.0]\n", "allocator.protected_issues.1"),
        ("[allocator]\nprotected_issues = [617, '618']\n", "allocator.protected_issues.1"),
        ("[allocator]\nprotected_issues = [9223372036854775807, 9223372036854775808]\n",
         "allocator.protected_issues.1"),
        ("[allocator]\npriority_labels = 'priority:p0'\n", "allocator.priority_labels"),
        ("[allocator]\nprotected_labels = ['', 'keep']\n", "allocator.protected_labels.0"),
        ("[roster]\nalice = 'author'\n", "roster.alice"),
        ("[merge]\nrequire_status = 'ci/build'\n", "merge.require_status"),
        ("[merge]\nrequire_status = ['ci/build', '']\n", "merge.require_status.1"),
        ("[webhook]\nsecrets = 'a-secret-of-sufficient-length'\n", "webhook.secrets"),
        ("repositories = 'acme/widgets'\n", "repositories"),
        ("[mcp]\nallowed_origins = 'https://agents.example'\n", "mcp.allowed_origins"),
        ("[mcp]\nallowed_origins = ['https://agents.example', 'agents.example']\n", "mcp.allowed_origins"),
        ("[mcp.token_digests]\nalice = ['sha256:" + "a" * 64 + "', 5]\n", "mcp.token_digests.alice.1"),
        ("[mcp.token_digests]\nalice = ['sha256:" + "a" * 64 + "', 'sha256:A']\n", "mcp.token_digests"),
        ("[[repositories]]\nowner = 'acme'\n", "repositories.0.name"),
        ("[[repositories]]\nowner = 'acme'\nname = 'w'\n[[repositories]]\nname = 'g'\n", "repositories.1.owner"),
        ("[[repositories]]\nowner = 'acme'\nname = 'w'\nroster = { alice = 'author' }\n",
         "repositories.0.roster.alice"),
    ],
)
def test_a_list_from_toml_takes_every_element_or_refuses_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    assert _refused(tmp_path, text).key == key


def test_good_lists_keep_every_element(tmp_path: Path) -> None:
    settings = _load(
        tmp_path,
        "[allocator]\nprotected_issues = [617, 5]\nprotected_labels = ['keep', 'hold']\n",
        {
            "FOREMAN_ALLOCATOR__PRIORITY_LABELS": '["p0", "p1", "p2"]',
            "FOREMAN_ROSTER__ALICE": '["author", "reviewer"]',
            "FOREMAN_WEBHOOK__SECRETS": json.dumps([SECRET, SECRET + "-2"]),
        },
    )
    assert settings.allocator.protected_issues == [617, 5]
    assert settings.allocator.protected_labels == ["keep", "hold"]
    assert settings.allocator.priority_labels == ["p0", "p1", "p2"]
    assert settings.roster["alice"] == ["author", "reviewer"]
    assert len(settings.webhook_secrets()) == 2
    digests = _load(tmp_path, "[mcp.token_digests]\nalice = ['sha256:" + "a" * 64 + "', 'sha256:" + "b" * 64 + "']\n")
    assert [login for _, login in digests.mcp.digests()] == ["alice", "alice"]
    many = _load(tmp_path, "[[repositories]]\nowner = 'acme'\nname = 'w'\n[[repositories]]\nowner = 'acme'\n"
                 "name = 'g'\nroster = { alice = ['author', 'reviewer'] }\n")
    assert many.repository_keys() == ["acme/w", "acme/g"]
    assert many.for_repository("acme/g").roster == {"alice": ["author", "reviewer"]}
