"""git over HTTP with the bot's credentials, checked on a schedule: ``git ls-remote`` of a served repository's
default branch, bounded (a timeout, at most one at a time per control checkout), its latest result kept with when it
was taken. ``/readyz`` shows it (bot/app.py); the allocation's proof trusts a recent success instead of running
``ls-remote`` itself when the live base is already in the control checkout (bot/verbs/bootstrap/preflight.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from bot.gitops.remote import git_refusal
from bot.gitops.runner import GitRunner

#: How often foreman serve checks each served repository's git transport (seconds).
TRANSPORT_CHECK_INTERVAL_S: Final = 30.0
#: The longest one check may take: git is killed after it (a hung remote is a failed check, not a stuck one).
TRANSPORT_CHECK_TIMEOUT_S: Final = 10.0
#: A successful check older than this is not trusted by the proof (it runs ``ls-remote`` itself): two intervals and
#: a timeout, so one late check does not turn the proof's own ``ls-remote`` back on, a stopped schedule does.
TRANSPORT_TRUSTED_FOR_S: Final = 2 * TRANSPORT_CHECK_INTERVAL_S + TRANSPORT_CHECK_TIMEOUT_S


@dataclass(frozen=True, slots=True)
class TransportResult:
    """One check: whether git answered at ``clone_url`` with the bot's credentials, and what it saw."""

    ok: bool
    clone_url: str
    branch: str
    checked_at: float  # time.time() when the check ended
    took_s: float
    remote_sha: str | None  # the branch's commit as git saw it (None: failed, or no such branch)
    detail: str | None = None  # git's error, its tail (failed)
    reason: str | None = None  # ``clone_auth_failed`` / ``clone_repository_not_found`` (git_refusal), else None

    def age_s(self, now: float | None = None) -> float:
        return max(0.0, (time.time() if now is None else now) - self.checked_at)

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        doc: dict[str, Any] = {"ok": self.ok, "clone_url": self.clone_url, "branch": self.branch,
                               "age_s": round(self.age_s(now), 1), "took_s": round(self.took_s, 3),
                               "remote_sha": self.remote_sha}
        if not self.ok:
            doc.update(detail=self.detail, reason=self.reason)
        return doc


class TransportCheck:
    """The checks of one control checkout's remote: at most one runs at a time (a second caller gets the latest
    result instead of starting another git), each bounded by ``timeout_s``."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.latest: TransportResult | None = None
        self._running = threading.Lock()

    @property
    def running(self) -> bool:
        return self._running.locked()

    def run(self, clone_url: str, branch: str, *, cwd: Path, env: Mapping[str, str], auth: Mapping[str, str],
            timeout_s: float = TRANSPORT_CHECK_TIMEOUT_S) -> TransportResult | None:
        """The scheduled check (blocking: run it in a thread): ``ls_remote``, its result the latest. None when a
        check is already running (its result will be ``latest``)."""
        if not self._running.acquire(blocking=False):
            return None
        try:
            result = ls_remote(clone_url, branch, cwd=cwd, env=env, auth=auth, timeout_s=timeout_s)
            self.latest = result
            return result
        finally:
            self._running.release()

    def record(self, result: TransportResult) -> None:
        """A result learned elsewhere (the proof's own ``ls-remote``) is the latest too."""
        self.latest = result

    def trusted(self, clone_url: str, *, now: float | None = None) -> bool:
        """The latest check succeeded at this very URL, at most ``TRANSPORT_TRUSTED_FOR_S`` ago."""
        latest = self.latest
        return (latest is not None and latest.ok and latest.clone_url == clone_url
                and latest.age_s(now) <= TRANSPORT_TRUSTED_FOR_S)

    def to_dict(self, now: float | None = None) -> dict[str, Any]:
        """What ``/readyz`` shows: the latest result with its age, or that none was taken yet."""
        latest = self.latest
        if latest is None:
            return {"ok": None, "running": self.running, "detail": "not checked yet"}
        return {**latest.to_dict(now), "running": self.running}


def ls_remote(clone_url: str, branch: str, *, cwd: Path, env: Mapping[str, str], auth: Mapping[str, str],
              timeout_s: float) -> TransportResult:
    """``git ls-remote`` of ``refs/heads/<branch>`` at ``clone_url`` with ``auth`` (blocking), killed after
    ``timeout_s``."""
    started = time.monotonic()
    status, out, err = GitRunner(cwd, env=env, timeout_s=timeout_s).attempt(
        "ls-remote", "--", clone_url, f"refs/heads/{branch}", extra_env=auth)
    took = time.monotonic() - started
    if status != 0:
        return TransportResult(False, clone_url, branch, time.time(), took, None, err.strip()[-300:], git_refusal(err))
    return TransportResult(True, clone_url, branch, time.time(), took, out.split("\t", 1)[0].strip() or None)


#: The checks by control checkout path, for this process (the schedule writes them, the proof and /readyz read).
_CHECKS: dict[str, TransportCheck] = {}
_CHECKS_LOCK = threading.Lock()


def transport_check(checkout_path: Path) -> TransportCheck:
    """The transport check of the control checkout at ``checkout_path`` (made on first use)."""
    key = str(checkout_path)
    with _CHECKS_LOCK:
        found = _CHECKS.get(key)
        if found is None:
            found = _CHECKS[key] = TransportCheck(key)
        return found
