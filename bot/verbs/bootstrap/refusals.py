"""The error envelopes a bootstrap refuses with, and the exceptions its steps raise to refuse or compensate."""

from __future__ import annotations

from typing import Any

from bot.core.bootstrap import Blocked, key_problem, sha_problem
from bot.core.errors import Envelope, ErrorKind
from bot.core.reasons import RefusalReason
from bot.gitea import GiteaError, GiteaForbidden
from bot.verbs.bootstrap.context import TOOL, BootstrapResult


def make_envelope(kind: ErrorKind, message: str, remediate: str, action: str, *, reason: RefusalReason | None = None,
                  **details: Any) -> Envelope:
    return Envelope(error=kind, message=message, remediate=remediate, exact_next_action=action, details=details,
                    reason=reason)


def refused_result(issue_number: int, envelope: Envelope, key: str | None = None) -> BootstrapResult:
    return BootstrapResult(issue_number=issue_number, status="refused", idempotency_key=key, refusal=envelope)


def call_again(issue_number: int, key: str | None = None) -> str:
    suffix = f" with idempotency_key={key}" if key else ""
    return f"call {TOOL} for #{issue_number} again{suffix}"


def unavailable(issue_number: int, what: str, key: str | None = None) -> Envelope:
    return make_envelope(
        "unavailable",
        f"{what}; nothing was lost: the transition can resume where it stopped",
        "Wait until Gitea and the control checkout are reachable again, then repeat the same request.",
        call_again(issue_number, key),
    )


def lease_ended() -> Envelope:
    return make_envelope("stale_pin", "the lease ended while the request was being checked", "Nothing was created.",
                         "call gitea_get_runtime_context to see your leases", reason="lease_ended")


class StepFailed(Exception):
    """A step cannot go on: compensate."""

    def __init__(self, blocked: Blocked, **details: Any) -> None:
        super().__init__(blocked.message)
        self.blocked = blocked
        self.details = details


def observed_details(details: dict[str, Any]) -> dict[str, Any]:
    """A failure's observed details (the live base, Gitea's assignees, ...) for an envelope's ``details``."""
    return {k: v for k, v in details.items() if k not in ("reason", "idempotency_key", "kept", "left")}


class TransientFailure(Exception):
    """Gitea or git is unreachable right now: stop, keep the journal open, let a replay resume."""


class OperatorMustFix(Exception):
    """Only the operator can fix this (the token, the clone URL, the checkout's origin): refuse with the envelope
    naming what to change, keep any open transition as it is (a replay resumes once it is fixed)."""

    def __init__(self, envelope: Envelope) -> None:
        super().__init__(envelope.message)
        self.envelope = envelope


REPOINT = "foreman checkout repoint"


def token_envelope(reason: RefusalReason, message: str, then: str, **details: Any) -> Envelope:
    """``not_authorized`` for a token Gitea (its API or its git endpoint) refuses; never carries the token."""
    return make_envelope(
        "not_authorized", message,
        "foreman authenticates to Gitea's API and to git over HTTP with gitea.token (or gitea.token_file); that"
        " token must be the bot account's, valid, with read:repository and write:issue.",
        f"the operator fixes gitea.token (or gitea.token_file) and checks it with `foreman check-config`, then {then}",
        reason=reason, **details)


def git_envelope(reason: RefusalReason, url: str, failure: str, then: str) -> Envelope:
    if reason == "clone_auth_failed":
        return token_envelope(reason, f"git over HTTP refused gitea.token for {url}: {failure}", then,
                              clone_url=url)
    return make_envelope(
        "not_authorized", f"git at {url} answers that the repository is not there for the bot account: {failure}",
        "Gitea shows a private repository only to accounts with access; the URL may also name another server.",
        f"the operator gives the bot account read access to the repository (or corrects repository.clone_url /"
        f" repository.clone_url_rewrite), then {then}", reason=reason, clone_url=url)


def api_refusal(exc: GiteaError, then: str) -> Envelope | None:
    """The envelope for Gitea's API refusing the token (401) or its scope (403), else None."""
    if isinstance(exc, GiteaForbidden):
        what = "refused gitea.token" if exc.status == 401 else "does not let gitea.token read the repository"
        return token_envelope("gitea_token_refused", f"Gitea's API {what} ({exc.status})", then,
                              status=exc.status)
    return None


def origin_envelope(n: int, origin: str | None, url: str) -> Envelope:
    return make_envelope(
        "invalid_state",
        f"the control checkout's origin ({origin}) is not the clone URL foreman uses now ({url}): Gitea reports"
        " another clone_url (an upgrade, a new ROOT_URL, Host or proxy) or repository.clone_url changed",
        "foreman never changes the checkout's origin on its own; the worktrees under branches/ are untouched.",
        f"the operator runs `{REPOINT}` (it proves {url} serves the same repository, points origin at it and"
        f" touches no worktree), then call {TOOL} for #{n} again",
        reason="checkout_origin", checkout_origin=origin, clone_url=url)


def input_problem(issue_number: object, caller: object, key: str | None, expected_base: str | None) -> str | None:
    if isinstance(issue_number, bool) or not isinstance(issue_number, int) or issue_number < 1:
        return "issue_number must be a positive integer"
    if not isinstance(caller, str) or not caller.strip():
        return "caller must be a login"
    if key is not None and key_problem(key):
        return f"idempotency_key {key_problem(key)}"
    if expected_base is not None and sha_problem(expected_base):
        return f"expected_base {sha_problem(expected_base)}"
    return None


def blocked_envelope(n: int, blocked: Blocked, released: bool, key: str | None, **details: Any) -> Envelope:
    if blocked.reason == "owner_unassignable":
        who = details.get("owner") or "the lease owner"
        action = (f"the operator grants {who} access to the repository in Gitea (read on pull requests or write"
                  f" on any unit; on a private repository an account without access cannot be assigned), then"
                  f" labels #{n} status:ready again")
    elif released:
        action = "call gitea_get_runtime_context to find your next assignment (foreman reported this on the issue)"
    elif blocked.kind == "stale_pin":
        action = call_again(n) + " (a new attempt pins the live base)"
    else:
        action = f"call gitea_post_issue_state on #{n} with BLOCKERS naming: {blocked.reason}"
    remediate = {
        "stale_pin": "The pinned state changed; nothing was rebased, repointed or overwritten.",
        "invalid_state": "Existing state is foreign, ambiguous or unprovable; it was left byte for byte as it is.",
        "conflict": "Another request holds the issue.",
    }[blocked.kind]
    return make_envelope(blocked.kind, blocked.message, remediate, action, reason=blocked.reason,
                         **({"idempotency_key": key} if key else {}), **details)
