"""What every `foreman` command shares: exit codes, output, the database, the rendering of a verb's result."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from bot.config import ConfigError, Settings
from state.db import Database, open_database
from state.deliveries import DeliveryStore

if TYPE_CHECKING:
    from bot.verbs.runtime import VerbResult


#: 0 done; 1 refused, blocked or the output pipe closed (a structured result is still printed where it can be);
#: 2 usage or configuration error (a taken port included).
EXIT_OK, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2


#: Commands that work across every served repository and so run without --repository: the whole inbox and
#: outbox, and `foreman mcp` (it serves the repositories whose roster names its identity; ``repository`` argument).
ALL_REPOSITORIES_COMMANDS = frozenset({"check-config", "deliveries", "replay", "outbox", "mcp"})


def repository_view(settings: Settings, given: str | None, *, command: str) -> Settings | dict[str, Any]:
    """The settings of the repository a command acts on (``--repository``, else the only served one), or the
    ``invalid_input`` envelope naming the served repositories: an unknown repository, or none given where
    [[repositories]] lists several and the command acts on one."""
    keys = settings.repository_keys()
    choices = ", ".join(keys)
    if not keys:  # [organization] alone: its repositories are discovered by `foreman serve`, not by a command
        if command in ALL_REPOSITORIES_COMMANDS:
            return settings
        org = settings.organization.name if settings.organization is not None else "OWNER"
        return {"error": "invalid_input",
                "message": f"`foreman {command}` acts on one repository and this config lists none: [organization] "
                           f"{org}'s repositories are discovered by `foreman serve` only",
                "remediate": "add a [[repositories]] entry for the repository (it overrides the organization's "
                             "defaults for it), then give --repository",
                "exact_next_action": f"add [[repositories]] owner = \"{org}\" name = \"NAME\" to the config, then "
                                     f"run foreman --repository {org}/NAME {command} ...",
                "repositories": keys}
    if given is not None:
        key = settings.find_repository(given)
        if key is None:
            return {"error": "invalid_input", "message": f"--repository {given!r} is not served here ({choices})",
                    "remediate": "give one of the served repositories ([repository] or [[repositories]])",
                    "exact_next_action": f"foreman --repository {keys[0]} {command} ...", "repositories": keys}
        return settings.for_repository(key)
    if len(keys) == 1 or command in ALL_REPOSITORIES_COMMANDS:
        return settings if len(keys) > 1 else settings.for_repository(keys[0])
    return {"error": "invalid_input",
            "message": f"`foreman {command}` acts on one repository and this config serves {len(keys)}: {choices}",
            "remediate": "say which with --repository OWNER/NAME",
            "exact_next_action": f"foreman --repository {keys[0]} {command} ...", "repositories": keys}


def emit(doc: Any, *, as_json: bool, text: str | None = None) -> None:
    if as_json:
        print(json.dumps(doc, indent=2, sort_keys=True, default=str))
    else:
        print(text if text is not None else json.dumps(doc, indent=2, sort_keys=True, default=str))


def refused(exc: LookupError | ValueError, *, listing: str) -> int:
    """A replay/retry of something missing (not_found) or not in a retryable state (invalid_state)."""
    emit(
        {
            "error": "invalid_state" if isinstance(exc, ValueError) else "not_found",
            "message": str(exc),
            "remediate": f"list the candidates with `{listing}` and pick one",
            "exact_next_action": f"run {listing}",
        },
        as_json=True,
    )
    return EXIT_REFUSED


async def with_db(settings: Settings, work: Callable[[Database], Awaitable[int]]) -> int:
    db = await open_database(settings.database)
    try:
        return await work(db)
    finally:
        await db.close()


async def with_store(settings: Settings, work: Callable[[DeliveryStore], Awaitable[int]]) -> int:
    return await with_db(settings, lambda db: work(DeliveryStore(db)))


def not_found(message: str, listing: str) -> int:
    emit(
        {
            "error": "not_found",
            "message": message,
            "remediate": f"list what exists with `{listing}` and pick one",
            "exact_next_action": f"run {listing}",
        },
        as_json=True,
    )
    return EXIT_REFUSED


def rendered(result: VerbResult) -> dict[str, Any]:
    """A verb's document as the CLI prints it: without the door's ``verb`` and the MCP tools to call ``next``."""
    return {key: value for key, value in result.doc.items() if key not in ("verb", "next")}


def config_error_envelope(exc: ConfigError) -> dict[str, Any]:
    """Every configuration problem at once; ``key`` and ``message`` stay the first one's (compatibility)."""
    more = f" (and {len(exc.errors) - 1} more: see errors)" if len(exc.errors) > 1 else ""
    return {
        "error": "invalid_config",
        "key": exc.key,
        "message": f"{exc.key}: {exc.message}{more}",
        "errors": [{"key": key, "message": message} for key, message in exc.errors],
        "remediate": "Fix each key listed in errors (config/foreman.example.toml documents every key), or the "
        "FOREMAN_<SECTION>__<KEY> variable that sets it.",
        "exact_next_action": "edit the config, then run foreman check-config --config PATH",
    }
