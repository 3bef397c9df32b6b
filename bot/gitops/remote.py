"""Talking to origin: which clone URLs are used, the token as a header, and what git's refusals mean."""

from __future__ import annotations

import urllib.parse
from typing import Literal

_ALLOWED_SCHEMES = ("http", "https", "file")


def auth_env(clone_url: str, token: str | None) -> dict[str, str]:
    """For an HTTP(S) clone URL: the token as an extra header through the environment (never in argv or in
    ``.git/config``). Nothing for ``file://`` URLs (the emulator's)."""
    if not token or urllib.parse.urlsplit(clone_url).scheme not in ("http", "https"):
        return {}
    return {
        "GIT_CONFIG_COUNT": "1",
        "GIT_CONFIG_KEY_0": "http.extraHeader",
        "GIT_CONFIG_VALUE_0": f"Authorization: token {token}",
    }


def clone_url_problem(url: str) -> str | None:
    """Why a clone URL reported by the API is refused (None when it is usable)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in _ALLOWED_SCHEMES:
        return f"clone_url scheme {parts.scheme or '(none)'!r} is not one of {', '.join(_ALLOWED_SCHEMES)}"
    if parts.scheme == "file" and not parts.path.startswith("/"):
        return "a file:// clone_url must name an absolute path"
    if parts.scheme != "file" and not parts.netloc:
        return "clone_url has no host"
    if "@" in parts.netloc:
        return "clone_url holds credentials (user or password before '@'); foreman sends gitea.token as a header"
    return None


#: What git (GIT_TERMINAL_PROMPT=0) prints when the server wants other credentials: Gitea's 401 makes git ask for
#: a user name it may not prompt for; a 403 or a rejected credential is reported as such.
_AUTH_FAILED = ("could not read username", "could not read password", "authentication failed",
                "the requested url returned error: 401", "the requested url returned error: 403")
#: A repository the credential cannot see: Gitea answers 404 "Repository not found" (githttp.go httpBase).
_NOT_FOUND = ("not found", "the requested url returned error: 404")


#: What git's HTTP server said no to (a refusal's reason).
GitRefusal = Literal["clone_auth_failed", "clone_repository_not_found"]


def git_refusal(stderr: str) -> GitRefusal | None:
    """``clone_auth_failed`` when git's HTTP server refused the credential, ``clone_repository_not_found`` when it
    answered that the repository is not there for it; None for anything else (network, disk, git itself)."""
    text = stderr.lower()
    if any(needle in text for needle in _AUTH_FAILED):
        return "clone_auth_failed"
    if "repository" in text and any(needle in text for needle in _NOT_FOUND):
        return "clone_repository_not_found"
    return None
