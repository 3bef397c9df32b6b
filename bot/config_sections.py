"""The configuration's section models: one pydantic model per TOML table, each refusing unknown keys."""

from __future__ import annotations

import hashlib
import re
import urllib.parse
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    Strict,
    ValidationInfo,
    field_validator,
    model_validator,
)

from bot.core.gateway import Role
from bot.core.grants import TOOL_CONTRACTS, GrantEffect, PolicyTemplate
from bot.core.vocabulary import MAX_ISSUE_NUMBER
from state.sql import postgres_url_problem, redact_url

#: An issue number in a config list: a real integer (never a bool, float or numeric string), 1..2^63-1.
IssueNumber = Annotated[int, Strict(), Field(gt=0, le=MAX_ISSUE_NUMBER)]
#: A label name in a config list: a non-empty string.
LabelName = Annotated[str, Field(min_length=1)]


class ConfigSection(BaseModel):
    # allow_inf_nan=False: `timeout_s = inf` or `nan` is refused, not an endless timeout or a failed comparison.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _booleans_are_not_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """TOML and JSON tell booleans from numbers; pydantic's lax mode would turn `port = true` into 1 and
        `log_json = 1` into true. Neither is what the operator meant: refuse both."""
        name = info.field_name
        annotation = cls.model_fields[name].annotation if name is not None else None
        if annotation in (int, float) and isinstance(value, bool):
            raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
        if annotation is bool and not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {type(value).__name__} {value!r}")
        return value


class ServerConfig(ConfigSection):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    log_json: bool = False
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    shutdown_grace_s: float = Field(default=10.0, ge=0)
    #: How long a connection may wait for a request's head, idle between requests or half-sent (aiohttp's one
    #: timer for both): a client that connects and stalls is cut when it expires.
    keepalive_timeout_s: float = Field(default=15.0, gt=0, le=3600)


class WebhookConfig(ConfigSection):
    path: str = "/webhook"
    # None means "not configured": the embedded default then generates one under var/.
    # An explicit empty list is a refusal to start.
    secrets: list[SecretStr] | None = None
    secrets_file: Path | None = None
    max_body_bytes: int = Field(default=5 * 1024 * 1024, gt=0)
    #: How long a delivery's body may take to arrive once its head is read: past it, 408 and the connection closes.
    read_timeout_s: float = Field(default=10.0, gt=0, le=600)

    @field_validator("path")
    @classmethod
    def _path_is_absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must start with '/'")
        return value


class DatabaseConfig(ConfigSection):
    #: SQLite (the embedded default): the database file.
    path: Path = Path("var/foreman.db")
    #: PostgreSQL instead: postgresql://user[:password]@host[:port]/dbname[?options]. Never logged as given.
    url: SecretStr | None = None
    #: A file holding that URL (one with a password in it need not be in the config).
    url_file: Path | None = None
    synchronous: Literal["FULL", "NORMAL"] = "FULL"
    busy_timeout_ms: int = Field(default=5000, ge=0)

    @field_validator("url")
    @classmethod
    def _url_is_postgresql(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not value.get_secret_value().startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a postgresql:// URL (postgresql://user@host:5432/dbname)")
        problem = None if value is None else postgres_url_problem(value.get_secret_value())
        if problem is not None:
            raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _one_backend(self) -> DatabaseConfig:
        if (self.url is not None or self.url_file is not None) and "path" in self.model_fields_set:
            url_key = "database.url" if self.url is not None else "database.url_file"
            raise ValueError(f"database.path (SQLite) and {url_key} (PostgreSQL) are both set: keep the one to use")
        return self

    @property
    def backend(self) -> Literal["sqlite", "postgresql"]:
        return "sqlite" if self.url is None else "postgresql"

    def postgres_url(self) -> str | None:
        return None if self.url is None else self.url.get_secret_value()

    def describe(self) -> str:
        """The database for logs and check-config: the SQLite path, or the URL with its password hidden."""
        url = self.postgres_url()
        return str(self.path) if url is None else redact_url(url)


class GiteaConfig(ConfigSection):
    url: str = "http://127.0.0.1:3000"
    token: SecretStr | None = None
    token_file: Path | None = None
    bot_login: str = "foreman-bot"
    timeout_s: float = Field(default=10.0, gt=0)
    probe_interval_s: float = Field(default=30.0, gt=0)
    #: login = that roster identity's own Gitea token (its PRs and reviews are posted as it, not as the bot).
    identity_tokens: dict[str, SecretStr] = Field(default_factory=dict)
    #: login = a file holding that identity's Gitea token; merged into identity_tokens at load.
    identity_token_files: dict[str, Path] = Field(default_factory=dict)

    @field_validator("identity_tokens")
    @classmethod
    def _one_token_each(cls, value: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for login, token in value.items():
            text = token.get_secret_value()
            if not text or any(c.isspace() for c in text):
                raise ValueError(f"the token of {login!r} must be one token (not empty, no spaces or line breaks)")
        return value

    @field_validator("url")
    @classmethod
    def _url_has_scheme(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL, without /api/v1")
        if value.rstrip("/").lower().endswith("/api/v1"):
            raise ValueError(
                f"must be Gitea's base URL without /api/v1 (the client adds it): {value.rstrip('/')[:-7]!r}"
            )
        return value.rstrip("/")


def clone_url_problem(url: str) -> str | None:
    """Why a configured clone URL (or a rewrite's ``to``) is refused: http, https or file only, a host (an
    absolute path for file), and never credentials (the token travels in a header, docs/bootstrap.md)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https", "file"):
        return f"must be an http://, https:// or file:// URL, not {parts.scheme or 'a bare path'!r}"
    if "@" in parts.netloc:
        return ("must not hold credentials (user or password before '@'): foreman sends gitea.token as a "
                "header; give the URL without them")
    if parts.scheme == "file":
        return None if parts.path.startswith("/") else "a file:// URL must name an absolute path"
    if not parts.hostname:
        return "names no host"
    return None


class CloneUrlRewrite(ConfigSection):
    """``[repository] clone_url_rewrite = { from = "...", to = "..." }``: a ``clone_url`` Gitea reports that
    starts with ``from`` is used with that prefix replaced by ``to`` (git's ``url.<to>.insteadOf <from>``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    from_: str = Field(alias="from", min_length=1)
    to: str = Field(min_length=1)

    @field_validator("from_")
    @classmethod
    def _from_is_http(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must be the http:// or https:// prefix of the clone_url Gitea reports")
        if "@" in urllib.parse.urlsplit(value).netloc:
            raise ValueError("must not hold credentials (user or password before '@')")
        return value

    @field_validator("to")
    @classmethod
    def _to_is_usable(cls, value: str) -> str:
        problem = clone_url_problem(value)
        if problem is not None:
            raise ValueError(problem)
        return value


class RepositoryConfig(ConfigSection):
    owner: str = "org"
    name: str = "repo"
    checkout_root: Path = Path("var/checkouts")
    #: The URL foreman clones and fetches from instead of the ``clone_url`` Gitea reports (for a ROOT_URL or
    #: Host foreman cannot reach). Exclusive with ``clone_url_rewrite``.
    clone_url: str | None = None
    #: Rewrites the reported ``clone_url``'s prefix (``from``) to ``to``; other URLs are used as reported.
    clone_url_rewrite: CloneUrlRewrite | None = None

    @field_validator("clone_url")
    @classmethod
    def _clone_url_is_usable(cls, value: str | None) -> str | None:
        if value is not None:
            problem = clone_url_problem(value)
            if problem is not None:
                raise ValueError(problem)
        return value

    @field_validator("clone_url_rewrite")
    @classmethod
    def _not_both(cls, value: CloneUrlRewrite | None, info: ValidationInfo) -> CloneUrlRewrite | None:
        if value is not None and info.data.get("clone_url") is not None:
            raise ValueError("give repository.clone_url or repository.clone_url_rewrite, not both")
        return value

    def effective_clone_url(self, reported: str) -> str:
        """The URL foreman clones from: ``clone_url`` when set, else the reported one with the rewrite's prefix
        replaced (when it starts with it), else the reported one."""
        if self.clone_url is not None:
            return self.clone_url
        rewrite = self.clone_url_rewrite
        if rewrite is not None and reported.startswith(rewrite.from_):
            return rewrite.to + reported[len(rewrite.from_):]
        return reported


class WorkerConfig(ConfigSection):
    concurrency: int = Field(default=4, ge=1, le=64)
    max_attempts: int = Field(default=5, ge=1)
    backoff_base_s: float = Field(default=2.0, gt=0)
    backoff_max_s: float = Field(default=300.0, gt=0)
    poll_interval_s: float = Field(default=0.5, gt=0)
    # A claim whose heartbeat is older than this belongs to a dead process and is taken back.
    claim_ttl_s: float = Field(default=30.0, gt=0)
    # While signed deliveries arrive faster than this (a burst), the drain loops wait before each claim, at most
    # max_stand_aside_s each time, so the webhook door answers Gitea first (bot/core/intake_burst.py). 0: never.
    intake_burst_per_s: float = Field(default=200.0, ge=0, le=1_000_000)
    max_stand_aside_s: float = Field(default=0.2, ge=0, le=5)


class OutboxConfig(ConfigSection):
    concurrency: int = Field(default=4, ge=1, le=64)  # issues sent in parallel (each issue in order)
    max_attempts: int = Field(default=8, ge=1)
    backoff_base_s: float = Field(default=1.0, gt=0)
    backoff_max_s: float = Field(default=300.0, gt=0)
    poll_interval_s: float = Field(default=1.0, gt=0)
    claim_ttl_s: float = Field(default=60.0, gt=0)
    verify_attempts: int = Field(default=2, ge=1, le=10)


_BOTH_QUEUES: list[Literal["review", "merge"]] = ["review", "merge"]


class AllocatorConfig(ConfigSection):
    priority_labels: list[LabelName] = Field(
        default_factory=lambda: ["priority:p0", "priority:p1", "priority:p2", "priority:p3"]
    )
    protected_issues: list[IssueNumber] = Field(default_factory=list)
    protected_labels: list[LabelName] = Field(default_factory=list)
    lease_ttl_s: float = Field(default=4 * 3600.0, gt=0)
    lease_grace_s: float = Field(default=120.0, ge=0)
    # Auto-allocation: a `status:ready` issue goes to the next idle roster author (least live leases,
    # then longest idle). Unset: on when the roster has at least one author. `false` turns it off.
    auto: bool | None = None
    max_leases_per_author: int = Field(default=1, ge=1, le=1000)
    auto_allocate_owner: str = ""  # a single named owner: auto-allocation considers only this roster author
    # The review and merge queues (docs/allocator.md): a review goes to an idle roster reviewer, an approved pull
    # request to an idle roster merger, each holding at most this many live leases.
    #: Which queues run by themselves (with auto-allocation on): none listed, a controller hands out reviews and
    #: merges with gitea_allocate_next_work (action review or merge), and reviewers may claim reviews.
    queues: list[Literal["review", "merge"]] = Field(default_factory=lambda: _BOTH_QUEUES.copy())
    max_leases_per_reviewer: int = Field(default=1, ge=1, le=1000)
    max_leases_per_merger: int = Field(default=1, ge=1, le=1000)
    #: How long a pull request may wait in the review or merge queue, with someone idle to take it, before `foreman
    #: invariants` reports it (queues.review_waits, queues.merge_waits).
    queue_wait_bound_s: float = Field(default=600.0, gt=0)

    @field_validator("auto", mode="before")
    @classmethod
    def _auto_is_a_boolean(cls, value: Any) -> Any:
        if value is not None and not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {type(value).__name__} {value!r}")
        return value


class BootstrapConfig(ConfigSection):
    """The worktree bootstrap transition (docs/bootstrap.md)."""

    lock_wait_s: float = Field(default=30.0, ge=0)  # how long a request waits for a running one on the same issue
    # login = Unix group: a worktree created for that login is handed to the group (bot/worktree_access.py), for
    # agents that run as Unix users of their own (docs/operating.md "Agents on their own Unix users").
    worktree_groups: dict[str, str] = Field(default_factory=dict)
    git_timeout_s: float = Field(default=300.0, gt=0)  # per git command
    release_lease_on_failure: bool = True  # compensation releases the lease (AC5) instead of leaving it to expire
    slug_length: int = Field(default=40, ge=1, le=100)  # the title part of issue-<N>-<slug>
    control_clean_check: Literal["preflight", "every_transition"] = "preflight"
    # What allocation does about the bootstrap: "run" (default) proves, leases and bootstraps in one call;
    # "preflight" proves before every lease (dry-run and apply) but leaves the bootstrap to the owner; "off" neither.
    on_allocate: Literal["off", "preflight", "run"] = "run"


class ReconcileConfig(ConfigSection):
    """Catch-up (bot/reconcile.py): what changed in Gitea while no webhook reached the service."""

    # Seconds between passes; 0 turns the timer off (the start-up pass always runs).
    interval_s: float = Field(default=60.0, ge=0)
    # Each pass reads from the watermark minus this much, for clock skew and writes racing the last pass.
    overlap_s: float = Field(default=60.0, ge=0, le=86400)


#: A stored token digest: ``sha256:`` and 64 lowercase hex digits (``foreman token-digest`` prints one).
TOKEN_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")


class McpConfig(ConfigSection):
    """Who may call the verb table over MCP (``foreman serve``'s ``/mcp``, docs/mcp.md) and how the endpoint is
    bounded. ``tokens`` (token = login) and ``token_files`` (login = file) hold usable tokens; ``token_digests``
    (login = digest, or a list of them) holds only their SHA-256, so the configuration need not hold a token."""

    tokens: dict[str, str] = Field(default_factory=dict)
    # login = file holding that login's token (one secret per file, e.g. systemd credentials); merged into tokens.
    token_files: dict[str, Path] = Field(default_factory=dict)
    token_digests: dict[str, list[str]] = Field(default_factory=dict)
    # Browser origins allowed to call /mcp (a request without Origin is always allowed: agents send none).
    allowed_origins: list[str] = Field(default_factory=list)
    max_body_bytes: int = Field(default=1 << 20, ge=4096, le=64 << 20)
    # Seconds a request's body may take to arrive, however it trickles in (408 after it).
    read_timeout_s: float = Field(default=10.0, gt=0, le=600)
    # Failed authentications one client address may make in a minute; beyond it every request from it is 429.
    auth_failures_per_minute: int = Field(default=20, ge=1, le=100_000)
    # Open sessions per identity (or run), and in all; one more is refused 503 until one ends.
    max_sessions: int = Field(default=32, ge=1, le=1_000_000)
    max_sessions_total: int = Field(default=10_000, ge=1, le=1_000_000)
    # Requests one identity (or run) may have in flight at once; one more is 429.
    max_requests_in_flight: int = Field(default=16, ge=1, le=10_000)
    # A session with no request for this long is closed; its client opens a new one.
    session_idle_s: float = Field(default=1800.0, gt=0, le=7 * 86400)
    # Characters of one body, comment or diff gitea_read_issue / gitea_read_pull_request answer in one call; the
    # rest is cut, with the argument (offset, comment_id + offset, file + page) that reads on.
    read_max_chars: int = Field(default=8000, ge=200, le=1_000_000)
    # login = the absolute path at which that agent sees the checkout root (its worktrees bind-mounted into a
    # sandbox or another host); "*" for every agent without its own. The runtime context answers worktree paths so.
    worktree_roots: dict[str, str] = Field(default_factory=dict)

    @field_validator("worktree_roots")
    @classmethod
    def _roots_are_absolute(cls, value: dict[str, str]) -> dict[str, str]:
        for login, root in value.items():
            parts = root.split("/")
            if not root.startswith("/") or ".." in parts or "\0" in root or len(root) > 1024:
                raise ValueError(f"{login}: {root[:80]!r} is not an absolute path without '..'")
        return value

    @field_validator("token_digests", mode="before")
    @classmethod
    def _one_digest_is_a_list_of_one(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {login: [digests] if isinstance(digests, str) else digests for login, digests in value.items()}
        return value

    @field_validator("token_digests")
    @classmethod
    def _digests_are_sha256(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for login, digests in value.items():
            for digest in digests:
                if not TOKEN_DIGEST.fullmatch(digest):
                    raise ValueError(f"{login}: a digest is 'sha256:' and 64 lowercase hex digits (foreman "
                                     "token-digest prints one from the token on its standard input)")
        return value

    @field_validator("allowed_origins")
    @classmethod
    def _origins_are_origins(cls, value: list[str]) -> list[str]:
        for origin in value:
            parsed = urllib.parse.urlsplit(origin)
            if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.path or parsed.query:
                raise ValueError(f"{origin!r} is not an origin (scheme://host[:port], nothing after it)")
        return value

    def digests(self) -> list[tuple[str, str]]:
        """Every (``sha256:`` digest, login) a bearer token may match: the digests, and the plain tokens' own."""
        pairs = [(f"sha256:{hashlib.sha256(token.encode()).hexdigest()}", login)
                 for token, login in self.tokens.items()]
        for login, digests in self.token_digests.items():
            pairs += [(digest, login) for digest in digests]
        return pairs


class DashboardConfig(ConfigSection):
    """The read-only dashboard at /dashboard (bot/dashboard/): off unless a token is configured."""

    token: SecretStr | None = None
    token_file: Path | None = None

    @field_validator("token")
    @classmethod
    def _token_is_long_enough(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value().strip()) < 16:
            raise ValueError("must be at least 16 characters (or leave it out to keep the dashboard off)")
        return value


class GrantCallConfig(ConfigSection):
    """One call of a run-grant policy template (docs/grants.md, "Policy templates")."""

    tool: str
    effect: GrantEffect
    args: dict[str, Any] = Field(default_factory=dict)

    @field_validator("tool")
    @classmethod
    def _known_tool(cls, value: str) -> str:
        if value not in TOOL_CONTRACTS:
            raise ValueError(f"unknown tool; tools are {', '.join(sorted(TOOL_CONTRACTS))}")
        return value


class GrantTemplateConfig(ConfigSection):
    """A policy template per ``role.action``: ordered exact calls, the last one the reserved teardown.

    Placeholders ``{issue}``, ``{branch}``, ``{worktree}``, ``{owner}`` are filled by the grant compiler.
    Effects: read, plan_only, mutate, teardown. The whole template is checked by
    ``bot.core.grants.check_template`` when the configuration is loaded (errors name ``grants."<key>".calls.N...``).
    """

    expires_after_s: int = Field(default=3600, gt=0)
    calls: list[GrantCallConfig] = Field(min_length=1)

    def template(self, key: str) -> PolicyTemplate:
        """The core's template (raises TemplateError naming each problem's path)."""
        return PolicyTemplate.from_mapping(key, self.model_dump(mode="python"))


class LifecycleConfig(ConfigSection):
    """The end of an issue's life (docs/operating.md, "After the merge"): what the teardown removes."""

    delete_branch_after_merge: bool = True  # delete the issue branch on Gitea when it is still the merged head
    remove_worktree: bool = True  # remove the bootstrap's worktree when clean and merged (never a dirty one)
    # A run's reserved teardown also removes the issue's worktree by the same rule (clean, HEAD in the default
    # branch); off by default: an author's worktree outlives a run so the next run resumes in it.
    remove_worktree_on_run_teardown: bool = False
    # Seconds between checks for sealed runs whose grant expired or was aborted (their reserved teardown runs
    # once, by itself); 0 turns the timer off (the check still runs at start-up).
    run_teardown_interval_s: float = Field(default=30.0, ge=0)


class MergeConfig(ConfigSection):
    """How ``gitea_merge_pull_request`` merges: one of Gitea's merge styles (``MergePullRequestForm.Do``)."""

    style: Literal["merge", "rebase", "rebase-merge", "squash", "fast-forward-only"] = "merge"
    #: Who merges what passes the gate: ``merger``, a roster merger the merge queue leases it to; ``foreman``, the
    #: service itself as the merger of record, one pull request at a time per base branch (docs/allocator.md).
    by: Literal["merger", "foreman"] = "merger"
    #: The commit status contexts (globs) a head needs to pass before it merges when no branch protection rule
    #: requires its own (``enable_status_check``); absent: the contexts seen on the base branch's last commit
    #: (none seen: none required); ``[]``: none.
    require_status: list[Annotated[str, Field(min_length=1, max_length=255)]] | None = Field(default=None,
                                                                                       max_length=50)
    #: How long one merge call waits, retrying with backoff, while Gitea still checks the PR's mergeability (its
    #: 405 "Please try again later" after a push or another merge) before it answers ``mergeability_checking``.
    checking_wait_s: float = Field(default=20.0, ge=0, le=300)
    #: How many times one merge call retries Gitea's 409 "merge push out of date" (another merge moved the base).
    push_retries: int = Field(default=3, ge=0, le=10)


class PublishConfig(ConfigSection):
    """The publish verb (docs/mcp.md, "Publishing, the pull request and duplicate work")."""

    # login = "Name <e-mail>": the git author of that roster login's commits (default "<login> <login@users.noreply>").
    authors: dict[str, str] = Field(default_factory=dict)

    @field_validator("authors")
    @classmethod
    def _identities(cls, value: dict[str, str]) -> dict[str, str]:
        for login, identity in value.items():
            if _IDENTITY.fullmatch(identity) is None:
                raise ValueError(f"{login}: expected \"Name <e-mail>\" on one line, got {identity!r}")
        return value

    def author_of(self, login: str) -> tuple[str, str]:
        """(name, e-mail) of ``login``'s commits."""
        found = _IDENTITY.fullmatch(self.authors.get(login, ""))
        return (found.group(1).strip(), found.group(2)) if found else (login, f"{login}@users.noreply")


_IDENTITY = re.compile(r"([^<>\r\n]*[^<>\s][^<>\r\n]*) <([^<>\s]+)>")


class RepositoryEntry(RepositoryConfig):
    """One ``[[repositories]]`` entry: a repository this process serves, with optional overrides of the
    top-level ``[roster]``, ``[allocator]``, ``[merge]`` and ``[grants]`` (each replaces the top-level table
    whole for this repository; left out, the top-level one applies)."""

    #: Required in an entry (the single table's defaults would name a repository nobody meant).
    owner: str = Field(min_length=1)
    name: str = Field(min_length=1)
    roster: dict[str, list[Role]] | None = None
    allocator: AllocatorConfig | None = None
    merge: MergeConfig | None = None
    grants: dict[str, GrantTemplateConfig] | None = None

    def base(self) -> RepositoryConfig:
        """The ``[repository]`` part (what every consumer of ``settings.repository`` reads)."""
        return RepositoryConfig.model_validate(
            {name: getattr(self, name) for name in RepositoryConfig.model_fields}
        )


class OrganizationConfig(ConfigSection):
    """``[organization]``: serve every repository of one Gitea organization, discovered from
    ``GET /orgs/{name}/repos`` at start and at each catch-up interval (bot/discovery.py). Each discovered
    repository gets these defaults; a ``[[repositories]]`` entry for one of them overrides them whole."""

    #: The organization's login (case-insensitive, as Gitea's).
    name: str = Field(min_length=1)
    #: Repository names of the organization never served (case-insensitive); their deliveries are ignored.
    exclude: list[str] = Field(default_factory=list)
    #: The checkout root of every discovered repository (worktrees under ``<checkout_root>/<owner>/<name>``);
    #: left out, ``[repository] checkout_root``'s default (``load_settings`` fills it in).
    checkout_root: Path | None = None
    #: The roster of every discovered repository; left out, the top-level ``[roster]``.
    roster: dict[str, list[Role]] | None = None

    @field_validator("name")
    @classmethod
    def _a_login(cls, value: str) -> str:
        if "/" in value or value != value.strip():
            raise ValueError(f"{value!r} is no organization login (no slash, no surrounding spaces)")
        return value

    @field_validator("exclude")
    @classmethod
    def _repository_names(cls, value: list[str]) -> list[str]:
        bad = [name for name in value if not name.strip() or "/" in name]
        if bad:
            raise ValueError(f"{bad!r}: list bare repository names of the organization (no owner/, not empty)")
        return value

    def excludes(self, name: str) -> bool:
        """Whether repository ``name`` of the organization is excluded (case-insensitive)."""
        return name.casefold() in {excluded.casefold() for excluded in self.exclude}

    def entry_for(self, name: str) -> RepositoryEntry:
        """The served entry of discovered repository ``name``: the organization's defaults."""
        fields: dict[str, Any] = {"owner": self.name, "name": name, "roster": self.roster}
        if self.checkout_root is not None:
            fields["checkout_root"] = self.checkout_root
        return RepositoryEntry.model_validate(fields)
