"""The errors a Gitea call raises, grouped by meaning, and how the outbox stores them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from bot.core.errors import Envelope


class GiteaError(Exception):
    """A Gitea API call failed. ``status`` is the HTTP status (None when no answer came back).

    The text names the method, the path and Gitea's message; it never contains the token.
    """

    def __init__(self, message: str, *, status: int | None = None, method: str = "", path: str = "") -> None:
        self.message = message
        self.status = status
        self.method = method
        self.path = path
        where = f"{method} {path}: " if method else ""
        code = f"{status} " if status is not None else ""
        super().__init__(f"{where}{code}{message}")


class GiteaNotFound(GiteaError):
    """404: no such repository, issue, comment, branch or user (or not visible to this token)."""


class GiteaForbidden(GiteaError):
    """401/403: the token is missing, wrong, or lacks the permission for this call."""


class GiteaInvalid(GiteaError):
    """400/422: Gitea rejected the request's content; ``message`` is Gitea's reason."""


class GiteaConflict(GiteaError):
    """409: the object changed meanwhile (e.g. a stale ``content_version``)."""


class GiteaUnavailable(GiteaError):
    """5xx, timeouts or connection failures that outlasted every retry."""


class GiteaIssueGone(GiteaNotFound):
    """The issue does not exist (any more): Gitea answers the comment routes of a missing or deleted issue
    with a **500** (routers/api/v1/repo/issue_comment.go ListIssueComments/CreateIssueComment send the
    GetIssueByIndex error to APIErrorInternal), so the client asks ``GET /issues/{n}`` (a real 404) before
    calling it unavailable. Never retried."""

    def __init__(self, number: int, *, method: str, path: str) -> None:
        super().__init__(f"issue #{number} does not exist (deleted?)", status=404, method=method, path=path)
        self.number = number

    @property
    def envelope(self) -> Envelope:
        return Envelope(
            error="not_found",
            message=f"issue #{self.number} does not exist on Gitea any more (deleted, or never existed)",
            remediate="nothing can be written to a deleted issue; its outbox entries are not sent",
            exact_next_action=f"check that issue #{self.number} was deleted on purpose; open a new issue for the work",
            details={"issue_number": self.number},
        )


class GiteaUnassignable(GiteaInvalid):
    """Logins Gitea cannot assign on this repository: unknown accounts (services/issue/issue.go
    UpdateAssignees, GetUserByName) or accounts without access (models/perm/access/repo_permission.go
    CanBeAssigned: Write on a unit or Read on pull requests). Gitea answers both with a 500. Never retried."""

    def __init__(self, logins: Sequence[str], reasons: Mapping[str, str], *, method: str, path: str) -> None:
        detail = ", ".join(f"{login} ({reasons.get(login, 'no access')})" for login in logins)
        super().__init__(f"cannot be assigned: {detail}", status=500, method=method, path=path)
        self.logins = tuple(logins)
        self.reasons = dict(reasons)

    @property
    def envelope(self) -> Envelope:
        names = ", ".join(self.logins)
        return Envelope(
            error="invalid_input",
            message=f"Gitea cannot assign {names} on this repository (unknown account or no access)",
            remediate="give each account at least read access to the repository (read on pull requests, or "
            "write on any unit), or fix the login; the other assignees were left as they were",
            exact_next_action=f"grant {names} access to the repository (or correct the login), then "
            "`foreman outbox retry ID`",
            details={"logins": list(self.logins), "reasons": self.reasons},
        )


def refusal_text(exc: GiteaError) -> str:
    """An error as the outbox stores it: the class, the message, and the envelope when the error has one."""
    text = f"{type(exc).__name__}: {exc}"
    envelope = getattr(exc, "envelope", None)
    if isinstance(envelope, Envelope):
        text += f" | exact_next_action: {envelope.exact_next_action}"
    return text


def error_for(status: int, message: str, method: str, path: str) -> GiteaError:
    """The GiteaError subclass that names what an HTTP ``status`` means."""
    kind: type[GiteaError]
    if status == 404:
        kind = GiteaNotFound
    elif status in (401, 403):
        kind = GiteaForbidden
    elif status in (400, 422):
        kind = GiteaInvalid
    elif status == 409:
        kind = GiteaConflict
    elif status >= 500:
        kind = GiteaUnavailable
    else:
        kind = GiteaError
    return kind(message, status=status, method=method, path=path)
