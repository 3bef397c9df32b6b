"""Configuration: TOML file, FOREMAN_<SECTION>__<KEY> environment overrides, `<key>_file` secrets."""

from __future__ import annotations

import os
import secrets as secrets_mod
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic import Field, SecretStr, ValidationError

from bot.config_sections import (
    AllocatorConfig,
    BootstrapConfig,
    ConfigSection,
    DashboardConfig,
    DatabaseConfig,
    GiteaConfig,
    GrantTemplateConfig,
    LifecycleConfig,
    McpConfig,
    MergeConfig,
    OrganizationConfig,
    OutboxConfig,
    PublishConfig,
    ReconcileConfig,
    RepositoryConfig,
    RepositoryEntry,
    ServerConfig,
    WebhookConfig,
    WorkerConfig,
)
from bot.core import issue_state
from bot.core.gateway import Role
from bot.core.grants import TemplateError
from bot.core.jsontext import JSONTextError, strict_loads
from state.sql import postgres_url_problem

DEFAULT_CONFIG_PATH = Path("config/foreman.toml")
ENV_PREFIX = "FOREMAN_"
GENERATED_SECRET_NAME = "webhook-secret"  # noqa: S105 (a file name)


class ConfigError(Exception):
    """Configuration problems, each naming the offending key (dotted, e.g. ``webhook.secrets``).

    ``errors`` lists every problem found, as (key, message) pairs; ``key`` and ``message`` are the first's.
    """

    def __init__(self, key: str, message: str, *, errors: list[tuple[str, str]] | None = None) -> None:
        self.errors: list[tuple[str, str]] = errors or [(key, message)]
        more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        super().__init__(f"{key}: {message}{more}")
        self.key = key
        self.message = message

    @classmethod
    def of(cls, errors: list[tuple[str, str]]) -> ConfigError:
        return cls(errors[0][0], errors[0][1], errors=list(errors))


class Settings(ConfigSection):
    """The whole validated configuration."""

    server: ServerConfig = ServerConfig()
    webhook: WebhookConfig = WebhookConfig()
    database: DatabaseConfig = DatabaseConfig()
    gitea: GiteaConfig = GiteaConfig()
    repository: RepositoryConfig = RepositoryConfig()
    #: ``[[repositories]]``: many repositories in one process (exclusive with ``[repository]``); empty: the one
    #: ``[repository]`` is served. See ``served_repositories`` and ``for_repository``.
    repositories: list[RepositoryEntry] = Field(default_factory=list)
    #: ``[organization]``: every repository of one organization, discovered while running (bot/discovery.py);
    #: ``repositories`` then holds the explicit entries (served whatever the discovery finds) and, in a running
    #: service, the discovered ones after them (``with_repositories``).
    organization: OrganizationConfig | None = None
    worker: WorkerConfig = WorkerConfig()
    outbox: OutboxConfig = OutboxConfig()
    allocator: AllocatorConfig = AllocatorConfig()
    bootstrap: BootstrapConfig = BootstrapConfig()
    reconcile: ReconcileConfig = ReconcileConfig()
    roster: dict[str, list[Role]] = Field(default_factory=dict)
    mcp: McpConfig = McpConfig()
    grants: dict[str, GrantTemplateConfig] = Field(default_factory=dict)
    dashboard: DashboardConfig = DashboardConfig()
    lifecycle: LifecycleConfig = LifecycleConfig()
    merge: MergeConfig = MergeConfig()
    publish: PublishConfig = PublishConfig()

    def webhook_secrets(self) -> list[bytes]:
        """The configured webhook secrets as bytes (after load_settings resolved files)."""
        return [s.get_secret_value().encode() for s in self.webhook.secrets or []]

    def authors(self) -> list[str]:
        """Roster logins with the author role, in login order."""
        return sorted(login for login, roles in self.roster.items() if "author" in roles)

    def auto_allocation(self) -> bool:
        """Whether a ready issue is allocated automatically: `[allocator] auto`, by default on when the roster
        has an author (or a single named `auto_allocate_owner` is set)."""
        cfg = self.allocator
        if cfg.auto is not None:
            return cfg.auto
        return bool(self.authors() or cfg.auto_allocate_owner)

    def gitea_token(self) -> str | None:
        return self.gitea.token.get_secret_value() if self.gitea.token else None

    def identity_token(self, login: str) -> str | None:
        """The roster identity's own Gitea token (``gitea.identity_tokens``), or None: it then acts as the bot."""
        for name, token in self.gitea.identity_tokens.items():
            if name.lower() == login.lower():
                return token.get_secret_value()
        return None

    @property
    def repo_key(self) -> str:
        """The key every store files the configured repository under (``owner/name`` in lower case)."""
        return issue_state.repo_key(f"{self.repository.owner}/{self.repository.name}")

    def served_repositories(self) -> list[RepositoryEntry]:
        """Every repository this process serves, in configuration order: the ``[[repositories]]`` entries, or
        the one ``[repository]`` (as an entry without overrides)."""
        if self.repositories or self.organization is not None:
            return list(self.repositories)
        return [RepositoryEntry.model_validate(self.repository.model_dump())]

    def repository_keys(self) -> list[str]:
        """The repo keys of ``served_repositories``, in configuration order."""
        return [repo_key_of(entry) for entry in self.served_repositories()]

    def find_repository(self, full_name: str) -> str | None:
        """The served repository's key for ``owner/name`` (case-insensitive), or None when it is not served."""
        key = issue_state.repo_key(full_name)
        return key if key in self.repository_keys() else None

    def for_repository(self, key: str) -> Settings:
        """The settings of one served repository (``key`` from ``repository_keys``): ``repository`` is that
        entry, its overrides applied, ``repositories`` empty, so every consumer reads ``settings.repository``
        and ``settings.repo_key`` as with one ``[repository]``. KeyError for a repository not served."""
        for entry in self.served_repositories():
            if repo_key_of(entry) != key:
                continue
            update: dict[str, Any] = {"repository": entry.base(), "repositories": [], "organization": None}
            for name in ("roster", "allocator", "merge", "grants"):
                override = getattr(entry, name)
                if override is not None:
                    update[name] = override
            return self.model_copy(update=update)
        raise KeyError(key)

    def with_repositories(self, entries: list[RepositoryEntry]) -> Settings:
        """These settings serving ``entries`` (the service's view after an organization's discovery pass);
        ``repository`` is the first of them, as ``load_settings`` makes it."""
        update: dict[str, Any] = {"repositories": list(entries)}
        if entries:
            update["repository"] = entries[0].base()
        return self.model_copy(update=update)

    def all_roster_logins(self) -> set[str]:
        """Every login on the top-level roster or on any repository's own roster, in lower case."""
        logins = {login.lower() for login in self.roster}
        for entry in self.repositories:
            logins.update(login.lower() for login in entry.roster or {})
        if self.organization is not None:
            logins.update(login.lower() for login in self.organization.roster or {})
        return logins


def repo_key_of(repository: RepositoryConfig) -> str:
    """The store key of a configured repository: ``owner/name`` in lower case."""
    return issue_state.repo_key(f"{repository.owner}/{repository.name}")


def _loc_to_key(loc: tuple[int | str, ...]) -> str:
    return ".".join(str(part) for part in loc) or "<root>"



def _parse_env_value(raw: str) -> Any:
    """Env values are strings; lists, tables, numbers and booleans may be given as JSON.

    A JSON value is decoded strictly: a repeated object key, NaN/Infinity, or nesting deeper than the decoder
    takes is refused rather than decoded to something else.
    """
    stripped = raw.strip()
    if stripped[:1] in ("[", "{") or stripped in ("true", "false"):
        try:
            return strict_loads(stripped)
        except JSONTextError as exc:
            raise ValueError(f"not valid JSON: {exc}") from None
    return raw


def apply_env_overrides(
    data: dict[str, Any], environ: Mapping[str, str], *, errors: list[tuple[str, str]] | None = None
) -> dict[str, Any]:
    """Overlay FOREMAN_<SECTION>__<KEY>=value onto the file's data (FOREMAN_CONFIG is not a key).

    With ``errors``, a bad variable is recorded there (and skipped) instead of raising ConfigError at once.
    """
    merged: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in data.items()}
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        parts = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
        problem: tuple[str, str] | None = None
        if any(not p for p in parts):
            problem = (name, "empty section or key in environment override")
        else:
            try:
                value = _parse_env_value(raw)
            except ValueError as exc:
                problem = (".".join(parts), f"from {name}: {exc}")
        if problem is not None:
            if errors is None:
                raise ConfigError(*problem)
            errors.append(problem)
            continue
        node = merged
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
    return merged


#: Path-valued keys; a relative value resolves against the config file's folder (DESIGN 3, 2026-12).
PATH_KEYS: tuple[tuple[str, str], ...] = (
    ("database", "path"),
    ("repository", "checkout_root"),
    ("webhook", "secrets_file"),
    ("gitea", "token_file"),
    ("dashboard", "token_file"),
    ("database", "url_file"),
)


def _read_secret_file(key: str, path: Path, errors: list[tuple[str, str]]) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        errors.append((key, f"cannot read {path}: {exc.strerror}"))
    except UnicodeDecodeError:
        errors.append((key, f"{path} is not UTF-8 text"))
    return None


def _resolve_paths(settings: Settings, base: Path) -> Settings:
    """Every relative path key, given or defaulted, made absolute against ``base`` (the config file's folder)."""
    sections: dict[str, Any] = {}
    for section, key in PATH_KEYS:
        model = sections.get(section) or getattr(settings, section)
        value = getattr(model, key)
        if value is not None and not value.is_absolute():
            sections[section] = model.model_copy(update={key: Path(os.path.normpath(base / value))})
    entries = [_resolved_entry(entry, base) for entry in settings.repositories]
    if entries != settings.repositories:
        sections["repositories"] = entries
    org = settings.organization
    if org is not None:  # a discovered repository's root: the organization's, else [repository]'s default
        root = org.checkout_root or (sections.get("repository") or settings.repository).checkout_root
        root = root if root.is_absolute() else Path(os.path.normpath(base / root))
        if root != org.checkout_root:
            sections["organization"] = org.model_copy(update={"checkout_root": root})
    return settings.model_copy(update=sections) if sections else settings


def _resolved_entry(entry: RepositoryEntry, base: Path) -> RepositoryEntry:
    root = entry.checkout_root
    if root.is_absolute():
        return entry
    return entry.model_copy(update={"checkout_root": Path(os.path.normpath(base / root))})


def _check_repositories(settings: Settings, errors: list[tuple[str, str]]) -> None:
    """``[repository]`` and ``[[repositories]]`` are exclusive; no repository is listed twice (Gitea's owner and
    repository names are case-insensitive, so ``Org/Repo`` and ``org/repo`` are one)."""
    if settings.organization is not None and "repository" in settings.model_fields_set:
        errors.append(("organization", "give [organization] (and [[repositories]] entries overriding its "
                       "defaults) or [repository], not both: move the [repository] table into a [[repositories]] "
                       "entry"))
    if settings.organization is not None:
        org = settings.organization.name.casefold()
        for index, entry in enumerate(settings.repositories):
            if entry.owner.casefold() == org and settings.organization.excludes(entry.name):
                errors.append((f"repositories.{index}", f"{entry.owner}/{entry.name} is also in organization.exclude:"
                               " drop it from one of the two"))
    if not settings.repositories:
        return
    if "repository" in settings.model_fields_set:
        errors.append(("repositories", "give [repository] (one repository) or [[repositories]] (many), not both: "
                       "move the [repository] table into a [[repositories]] entry"))
    seen: dict[str, int] = {}
    for index, entry in enumerate(settings.repositories):
        key = repo_key_of(entry)
        if key in seen:
            errors.append((f"repositories.{index}", f"{entry.owner}/{entry.name} is also repositories.{seen[key]} "
                           "(owner and name are case-insensitive): list each repository once"))
        seen.setdefault(key, index)


def _first_repository(settings: Settings) -> Settings:
    """With ``[[repositories]]``, ``settings.repository`` is the first entry (never the defaulted org/repo)."""
    if not settings.repositories:
        return settings
    return settings.model_copy(update={"repository": settings.repositories[0].base()})


def _secret_from_file(
    section: str, name: str, given: object, path: Path | None, errors: list[tuple[str, str]]
) -> str | None:
    """The text of ``<section>.<name>_file`` when it is set and ``<section>.<name>`` is not (both set: an error)."""
    if path is None:
        return None
    key = f"{section}.{name}_file"
    if given is not None:
        errors.append((key, f"give {section}.{name} or {key}, not both"))
        return None
    return _read_secret_file(key, path, errors)


def _resolve_secret_files(settings: Settings, errors: list[tuple[str, str]]) -> Settings:
    """webhook.secrets_file (one secret a line), gitea.token_file, dashboard.token_file, database.url_file."""
    webhook, gitea, dashboard = settings.webhook, settings.gitea, settings.dashboard
    text = _secret_from_file("webhook", "secrets", webhook.secrets, webhook.secrets_file, errors)
    if text is not None:
        found = [SecretStr(line.strip()) for line in text.splitlines() if line.strip()]
        webhook = webhook.model_copy(update={"secrets": found})
    token = _secret_from_file("gitea", "token", gitea.token, gitea.token_file, errors)
    if token is not None:
        gitea = gitea.model_copy(update={"token": SecretStr(token)})
    text = _secret_from_file("dashboard", "token", dashboard.token, dashboard.token_file, errors)
    if text is not None and len(text) < 16:
        errors.append(("dashboard.token_file", f"{dashboard.token_file} holds fewer than 16 characters"))
    elif text is not None:
        dashboard = dashboard.model_copy(update={"token": SecretStr(text)})
    database = settings.database
    url = _secret_from_file("database", "url", database.url, database.url_file, errors)
    if url is not None and not url.startswith(("postgresql://", "postgres://")):
        errors.append(("database.url_file", f"{database.url_file} does not hold a postgresql:// URL"))
    elif url is not None and (problem := postgres_url_problem(url)) is not None:
        errors.append(("database.url_file", f"{database.url_file}: {problem}"))
    elif url is not None:
        database = database.model_copy(update={"url": SecretStr(url)})
    return settings.model_copy(update={"webhook": webhook, "gitea": gitea, "dashboard": dashboard,
                                       "database": database})


def _resolve_mcp_token_files(settings: Settings, base: Path, errors: list[tuple[str, str]]) -> Settings:
    """mcp.token_files (login = file), merged into mcp.tokens; each file holds one token."""
    mcp = settings.mcp
    if mcp.token_files:
        tokens = dict(mcp.tokens)
        for login, path in sorted(mcp.token_files.items()):
            key = f"mcp.token_files.{login}"
            token = _read_secret_file(key, path if path.is_absolute() else base / path, errors)
            if token is None:
                continue
            if not token or any(c.isspace() for c in token):
                errors.append((key, f"{path} must hold one token (no spaces or line breaks)"))
            elif tokens.get(token, login) != login:
                errors.append((key, f"the token in {path} is already {tokens[token]}'s in mcp.tokens"))
            else:
                tokens[token] = login
        mcp = mcp.model_copy(update={"tokens": tokens})
    return settings.model_copy(update={"mcp": mcp})


def _resolve_identity_tokens(settings: Settings, base: Path, errors: list[tuple[str, str]]) -> Settings:
    """gitea.identity_token_files (login = file) merged into gitea.identity_tokens; every login must be a roster
    identity, and its token neither the bot's nor another identity's (a shared token is one Gitea account)."""
    gitea = settings.gitea
    tokens = dict(gitea.identity_tokens)
    for login, path in sorted(gitea.identity_token_files.items()):
        key = f"gitea.identity_token_files.{login}"
        if login in tokens:
            errors.append((key, f"give gitea.identity_tokens.{login} or {key}, not both"))
            continue
        token = _read_secret_file(key, path if path.is_absolute() else base / path, errors)
        if token is None:
            continue
        if not token or any(c.isspace() for c in token):
            errors.append((key, f"{path} must hold one token (no spaces or line breaks)"))
        else:
            tokens[login] = SecretStr(token)
    roster = settings.all_roster_logins()
    owners: dict[str, str] = {}
    bot = settings.gitea_token()
    for login, secret in sorted(tokens.items()):
        key = f"gitea.identity_tokens.{login}"
        value = secret.get_secret_value()
        if login.lower() not in roster:
            errors.append((key, f"{login!r} is not a roster identity (add it to [roster] or remove its token)"))
        elif bot is not None and value == bot:
            errors.append((key, "is the bot's gitea.token: give the identity its own account's token"))
        elif value in owners:
            errors.append((key, f"is also {owners[value]}'s token: each identity needs its own Gitea account"))
        owners.setdefault(value, login)
    gitea = gitea.model_copy(update={"identity_tokens": tokens})
    return settings.model_copy(update={"gitea": gitea})


def _raw_problems(data: Mapping[str, Any], base: Path, errors: list[tuple[str, str]]) -> None:
    """When validation failed, still report unreadable secret files and short secrets (every error at once)."""
    for section, key in (("webhook", "secrets_file"), ("gitea", "token_file")):
        table = data.get(section)
        value = table.get(key) if isinstance(table, Mapping) else None
        if isinstance(value, str):
            path = Path(value)
            _read_secret_file(f"{section}.{key}", path if path.is_absolute() else base / path, errors)
    webhook = data.get("webhook")
    secrets = webhook.get("secrets") if isinstance(webhook, Mapping) else None
    if isinstance(secrets, list) and all(isinstance(item, str) for item in secrets):
        _check_secret_values([SecretStr(item) for item in secrets], errors)


def _check_secrets(settings: Settings, errors: list[tuple[str, str]]) -> None:
    if settings.webhook.secrets is not None:
        _check_secret_values(settings.webhook.secrets, errors)


def _check_secret_values(found: list[SecretStr], errors: list[tuple[str, str]]) -> None:
    if not found:
        errors.append((
            "webhook.secrets",
            "is an empty list: the service refuses to accept unsigned webhooks. "
            "Remove the key to have a secret generated, or list at least one secret.",
        ))
    for index, secret in enumerate(found):
        if len(secret.get_secret_value()) < 16:
            errors.append((f"webhook.secrets.{index}", "is shorter than 16 characters"))


def _check_grants(settings: Settings, errors: list[tuple[str, str]]) -> None:
    """Every run-grant template must compile in principle; each error names the exact key of its problem."""
    tables = [("grants", settings.grants)]
    tables += [(f"repositories.{i}.grants", entry.grants) for i, entry in enumerate(settings.repositories)
               if entry.grants is not None]
    for prefix, grants in tables:
        for key, template in grants.items():
            try:
                template.template(key)
            except TemplateError as exc:
                for path, message in exc.problems:
                    suffix = "" if path == "<key>" else f".{path}"
                    errors.append((f"{prefix}.{key}{suffix}", message))


def _config_source(path: Path | None, env: Mapping[str, str]) -> tuple[Path, str | None]:
    """The config file and the key naming where it came from (None: the default, which may be absent)."""
    if path is not None:
        return path, "--config"
    if env.get("FOREMAN_CONFIG"):
        return Path(env["FOREMAN_CONFIG"]), "FOREMAN_CONFIG"
    return DEFAULT_CONFIG_PATH, None


def load_settings(
    path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
) -> Settings:
    """Read, overlay and validate the configuration; raise ConfigError naming every problem's key.

    The file is ``path`` (``--config``), else ``$FOREMAN_CONFIG``, else ``config/foreman.toml``; a file named by
    the first two must exist (never a silent run on defaults). Relative paths (database.path,
    repository.checkout_root, webhook.secrets_file, gitea.token_file), whether given or defaulted, resolve
    against the config file's folder; without a config file, against the working directory.
    """
    env = os.environ if environ is None else environ
    config_path, source = _config_source(path, env)
    data: dict[str, Any] = {}
    if config_path.is_file():
        try:
            data = tomllib.loads(config_path.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(str(config_path), f"is not valid TOML: {exc}") from exc
        except UnicodeDecodeError:
            raise ConfigError(str(config_path), "is not UTF-8 text") from None
        except OSError as exc:
            raise ConfigError(str(config_path), f"cannot be read: {exc.strerror}") from exc
        base = config_path.resolve().parent
    elif source is not None:
        what = "is not a file" if config_path.exists() else "does not exist"
        raise ConfigError(source, f"{config_path} {what}")
    else:
        base = Path.cwd()
    errors: list[tuple[str, str]] = []
    data = apply_env_overrides(data, env, errors=errors)
    try:
        settings = Settings.model_validate(data)
    except ValidationError as exc:
        errors.extend((_loc_to_key(e["loc"]), e["msg"]) for e in exc.errors())
        _raw_problems(data, base, errors)
        raise ConfigError.of(errors) from None
    _check_repositories(settings, errors)
    settings = _first_repository(_resolve_paths(settings, base))
    settings = _resolve_secret_files(settings, errors)
    settings = _resolve_mcp_token_files(settings, base, errors)
    settings = _resolve_identity_tokens(settings, base, errors)
    _check_secrets(settings, errors)
    _check_grants(settings, errors)
    if errors:
        raise ConfigError.of(errors)
    return settings


def ensure_webhook_secret(settings: Settings) -> tuple[Settings, Path | None]:
    """Embedded default: with no secret configured, generate one under the database's folder (0600).

    Returns the settings with the secret filled in, and the file's path when one was used (else None).
    """
    if settings.webhook.secrets is not None:
        return settings, None
    secret_path = settings.database.path.parent / GENERATED_SECRET_NAME
    try:
        secret_path.parent.mkdir(parents=True, exist_ok=True)
        if secret_path.exists():
            value = secret_path.read_text(encoding="utf-8").strip()
            if not value:
                raise ConfigError("webhook.secrets", f"the generated secret file {secret_path} is empty")
        else:
            value = secrets_mod.token_hex(32)
            fd = os.open(secret_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(value + "\n")
        os.chmod(secret_path, 0o600)
    except OSError as exc:  # the database's folder is read-only, say: a configuration error, not a traceback
        raise ConfigError(
            "webhook.secrets",
            f"none is configured and the generated one cannot be kept in {secret_path} ({exc.strerror}): set "
            "webhook.secrets, or make database.path's folder writable",
        ) from None
    webhook = settings.webhook.model_copy(update={"secrets": [SecretStr(value)]})
    return settings.model_copy(update={"webhook": webhook}), secret_path
