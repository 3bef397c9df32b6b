"""`foreman check-config`: the configuration and, if reachable, the Gitea credentials."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bot.cli.common import EXIT_OK, EXIT_REFUSED, EXIT_USAGE, config_error_envelope, emit, repository_view
from bot.cli.parsing import Commands, add_json
from bot.config import DEFAULT_CONFIG_PATH, ENV_PREFIX, ConfigError, Settings, load_settings

if TYPE_CHECKING:
    from bot.gitea import GiteaClient

#: The repository permissions (Gitea's permission API) that let the bot label, assign, comment and push branches.
WRITE_PERMISSIONS = ("write", "admin", "owner")


def _check(name: str, status: str, detail: str, **extra: Any) -> dict[str, Any]:
    return {"check": name, "status": status, "ok": status != "failed", "detail": detail, **extra}


def _failed(name: str, error: str, detail: str, remediate: str, **extra: Any) -> dict[str, Any]:
    return _check(name, "failed", detail, error=error, remediate=remediate, **extra)


async def _gitea_checks(settings: Settings) -> list[dict[str, Any]]:
    """Reachable, token accepted, token is gitea.bot_login's, then for each served repository: it exists, the bot
    may write to it.

    Each check runs only when the one before passed; the rest are reported as skipped (never as passed).
    """
    import aiohttp

    from bot.gitea import GiteaForbidden, client_for

    names = ("gitea_reachable", "token", "bot_login", "repository", "permission")
    url = settings.gitea.url
    checks: list[dict[str, Any]] = []

    def skip_rest(why: str) -> list[dict[str, Any]]:
        return checks + [_check(name, "skipped", why) for name in names[len(checks) :]]

    async with aiohttp.ClientSession() as session:
        client = client_for(session, settings, timeout_s=min(5.0, settings.gitea.timeout_s), max_attempts=1)
        if client is None:
            return skip_rest("no gitea.token configured: Gitea API calls are off")
        try:
            version = await client.get_version()
            checks.append(_check("gitea_reachable", "ok", f"Gitea {version} answers at {url}", version=version))
        except GiteaForbidden:  # a sign-in-only instance hides /version: the token check decides
            checks.append(_check("gitea_reachable", "ok", f"Gitea answers at {url} (/version needs sign-in)"))
        except Exception as exc:  # connection refused, timeout, 5xx, not a Gitea API at all
            checks.append(_failed(
                "gitea_reachable", "unavailable", f"no Gitea API answers at {url}: {_short(exc)}",
                "Check gitea.url (Gitea's base URL, without /api/v1) and that Gitea is running and reachable.",
            ))
            return skip_rest("needs gitea_reachable")
        try:
            login = (await client.get_own_user()).login
            checks.append(_check("token", "ok", f"the token is accepted: it belongs to {login}", login=login))
        except Exception as exc:
            error = "not_authorized" if isinstance(exc, GiteaForbidden) else "unavailable"
            checks.append(_failed(
                "token", error, f"Gitea refused the token: {_short(exc)}" if error == "not_authorized"
                else f"GET /user failed: {_short(exc)}",
                "Give gitea.token (or gitea.token_file) an access token of the bot's account with repository "
                "and issue scopes.",
            ))
            return skip_rest("needs token")
        if login.casefold() != (settings.gitea.bot_login or "").casefold():  # Gitea logins ignore case
            checks.append(_failed(
                "bot_login", "invalid_input",
                f"the token belongs to {login}, but gitea.bot_login is {settings.gitea.bot_login!r}: the bot would "
                "take its own events for someone else's",
                f"Set gitea.bot_login = {login!r}, or give the bot account's token.",
            ))
            return skip_rest("needs bot_login")
        checks.append(_check("bot_login", "ok", f"gitea.bot_login is the token's account ({login})"))
        passed = True
        for key in settings.repository_keys():
            view = settings.for_repository(key)
            repository_client = client_for(session, view, timeout_s=min(5.0, settings.gitea.timeout_s),
                                           max_attempts=1)
            assert repository_client is not None  # the same token as the client above
            found = await _repository_checks(repository_client, key, login, url)
            checks.extend(found)
            passed = passed and all(c["status"] == "ok" for c in found)
        if not passed:
            return checks
        if settings.gitea.identity_tokens:
            checks.append(await _identity_check(client, settings))
    return checks


async def _repository_checks(client: GiteaClient, repo: str, login: str, url: str) -> list[dict[str, Any]]:
    """One served repository: it exists (``repository``), and ``login`` may write to it (``permission``, skipped
    when the repository check failed). Each check names the repository."""
    from bot.gitea import GiteaError, GiteaNotFound, GiteaUnavailable

    def named(check: dict[str, Any]) -> dict[str, Any]:
        return {**check, "repository": repo}

    try:
        found = await client.get_repo()
        repository = named(_check("repository", "ok", f"{found.full_name or repo} exists", full_name=found.full_name))
    except GiteaNotFound:
        repository = named(_failed(
            "repository", "not_found", f"{repo} does not exist on {url}, or {login} cannot see it",
            "Fix repository.owner / repository.name, or give the bot's account access to the repository.",
        ))
    except GiteaError as exc:
        repository = named(_failed("repository", "unavailable", f"GET {repo}: {_short(exc)}",
                                   "Make sure Gitea answers, then run foreman check-config again."))
    if repository["status"] != "ok":
        return [repository, named(_check("permission", "skipped", "needs repository"))]
    try:
        permission = await client.get_user_permission(login)
    except GiteaError as exc:
        error = "unavailable" if isinstance(exc, GiteaUnavailable) else "not_authorized"
        return [repository, named(_failed("permission", error,
                                          f"cannot read {login}'s permission on {repo}: {_short(exc)}",
                                          f"Give {login} write permission on {repo} (Collaborators, or a team)."))]
    if permission not in WRITE_PERMISSIONS:
        return [repository, named(_failed(
            "permission", "not_authorized",
            f"{login} has {permission!r} permission on {repo}; the bot needs write (labels, assignees, comments, "
            "branches)", f"Give {login} write permission on {repo} (Collaborators, or a team).",
            permission=permission,
        ))]
    return [repository, named(_check("permission", "ok", f"{login} has {permission} permission on {repo}",
                                     permission=permission))]


async def _identity_check(client: GiteaClient, settings: Settings) -> dict[str, Any]:
    """Each ``gitea.identity_tokens`` token is accepted and is its own login's account (GET /user with it)."""
    from bot.gitea import GiteaError

    wrong: list[str] = []
    for login, secret in sorted(settings.gitea.identity_tokens.items()):
        try:
            found = (await client.with_token(secret.get_secret_value()).get_own_user()).login
        except GiteaError as exc:
            wrong.append(f"{login}: Gitea refused its token ({_short(exc)})")
            continue
        if found.casefold() != login.casefold():
            wrong.append(f"{login}: the token belongs to {found}")
    logins = ", ".join(sorted(settings.gitea.identity_tokens))
    if wrong:
        return _failed("identity_tokens", "invalid_input", "; ".join(wrong),
                       "Give each gitea.identity_tokens (or identity_token_files) login a token of its own account.")
    return _check("identity_tokens", "ok", f"each identity's token is its own account's: {logins}")


def _short(exc: Exception) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + "..."


def where_it_looked(config: Path | None, environ: Mapping[str, str]) -> list[str] | None:
    """Where foreman looked for a config file, each place with what it found there, when it found none (and no
    ``FOREMAN_<SECTION>__<KEY>`` variable configures it either); None when there is something to check."""
    if config is not None or environ.get("FOREMAN_CONFIG"):
        return None  # named: load_settings refuses a file that does not exist, naming the option or variable
    if DEFAULT_CONFIG_PATH.is_file() or any(k.startswith(ENV_PREFIX) and "__" in k for k in environ):
        return None
    return ["--config: not given", "$FOREMAN_CONFIG: not set",
            f"{Path.cwd() / DEFAULT_CONFIG_PATH}: " + ("not a file" if DEFAULT_CONFIG_PATH.exists()
                                                      else "does not exist"),
            f"{ENV_PREFIX}<SECTION>__<KEY> variables: none set"]


def main(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    """``foreman check-config``: exit 2 when no configuration was found (naming where it looked) or it is invalid
    (naming each key), 1 when a Gitea check failed, else 0. A short summary for people; ``--json`` the document."""
    env = os.environ if environ is None else environ
    looked = where_it_looked(args.config, env)
    if looked is not None:
        doc = {
            "error": "invalid_config", "key": "--config",
            "message": "no configuration file found; looked in: " + "; ".join(looked),
            "looked_in": looked,
            "remediate": "Give --config PATH (config/foreman.example.toml documents every key), set FOREMAN_CONFIG, "
            "or run it from the folder holding config/foreman.toml.",
            "exact_next_action": "run foreman check-config --config PATH",
        }
        if args.json:
            print(json.dumps(doc, sort_keys=True), file=sys.stderr)
        else:
            print("foreman check-config: no configuration file found. Looked in:\n"
                  + "".join(f"  {place}\n" for place in looked) + f"{doc['remediate']}", file=sys.stderr)
        return EXIT_USAGE
    try:
        settings = load_settings(args.config, environ=env)
    except ConfigError as exc:
        if args.json:
            print(json.dumps(config_error_envelope(exc), sort_keys=True), file=sys.stderr)
        else:
            print(f"foreman check-config: the configuration is not valid ({len(exc.errors)} problem(s)):\n"
                  + "".join(f"  {key}: {message}\n" for key, message in exc.errors)
                  + "Fix each key (config/foreman.example.toml documents every key), or the "
                  "FOREMAN_<SECTION>__<KEY> variable that sets it; --json prints this as JSON.", file=sys.stderr)
        return EXIT_USAGE
    from bot import logs

    logs.configure(json_lines=settings.server.log_json, level=settings.server.log_level)
    view = repository_view(settings, args.repository, command="check-config")
    if isinstance(view, dict):
        print(json.dumps(view, indent=2, sort_keys=True))
        return EXIT_USAGE
    return cmd_check_config(view, args, source=_source(args.config, env))


def _source(config: Path | None, environ: Mapping[str, str]) -> str:
    path = config or (Path(environ["FOREMAN_CONFIG"]) if environ.get("FOREMAN_CONFIG") else DEFAULT_CONFIG_PATH)
    return str(path.resolve()) if path.is_file() else "FOREMAN_* variables (no file)"


def cmd_check_config(settings: Settings, args: argparse.Namespace, *, source: str = "") -> int:
    """The config loaded (else exit 2 before this); then Gitea: exit 1 when any check failed (docs/operating.md)."""
    valid = f"the configuration is valid ({source})" if source else "the configuration is valid"
    checks = [_check("config", "ok", valid), *asyncio.run(_gitea_checks(settings))]
    by_name = {c["check"]: c for c in checks}
    failed = [c for c in checks if c["status"] == "failed"]
    gitea_ok = by_name["token"]["status"] == "ok"
    gitea: dict[str, Any] = {"ok": gitea_ok and not failed}
    if gitea_ok:
        gitea["login"] = by_name["token"]["login"]
    if failed or not gitea_ok:
        gitea["detail"] = (failed[0] if failed else by_name["token"])["detail"]
    doc: dict[str, Any] = {
        "ok": not failed,
        "config": "ok",
        "webhook": {
            "path": settings.webhook.path,
            "secrets": (
                f"{len(settings.webhook.secrets)} configured"
                if settings.webhook.secrets is not None
                else "none configured: one is generated under var/ on first start"
            ),
        },
        "database": settings.database.describe(),
        "gitea": gitea,
        "checks": checks,
    }
    if failed:
        first = failed[0]
        doc.update({
            "error": first["error"],
            "message": f"{len(failed)} check(s) failed: "
            + "; ".join(f"{c['check']}: {c['detail']}" for c in failed),
            "remediate": first["remediate"],
            "exact_next_action": "fix what the failed check names, then run foreman check-config again",
        })
    emit(doc, as_json=args.json, text=summary(checks))
    return EXIT_REFUSED if failed else EXIT_OK


def summary(checks: list[dict[str, Any]]) -> str:
    """The people's form: one line per check, a failed check's remedy under it, and the verdict last."""
    lines: list[str] = []
    for c in checks:
        where = f" [{c['repository']}]" if "repository" in c else ""
        lines.append(f"{c['status']:<8} {c['check']:<16} {c['detail']}{where}")
        if c["status"] == "failed":
            lines.append(f"{'':<8} {'':<16} fix: {c['remediate']}")
    failed = sum(c["status"] == "failed" for c in checks)
    skipped = sum(c["status"] == "skipped" for c in checks)
    if failed:
        lines.append(f"{failed} check(s) failed (exit 1); --json prints the whole report")
    else:
        lines.append(f"all {len(checks) - skipped} check(s) passed" + (f", {skipped} skipped" if skipped else ""))
    return "\n".join(lines)


def register(commands: Commands) -> None:
    """``foreman check-config``."""
    check = commands.add("check-config", "validate the config and, if reachable, the Gitea credentials")
    add_json(check)
