"""One mapping from a failed Gitea call to the verb's refusal, for every verb that asks Gitea to act (merge, review,
publish's read-back, opening a pull request, the duplicate assessment): what Gitea's answer means decides the kind,
the verb only names what it asked and what its caller can do next."""

from __future__ import annotations

from dataclasses import dataclass

from bot.core.errors import Envelope
from bot.gitea.errors import GiteaConflict, GiteaError, GiteaForbidden, GiteaInvalid, GiteaNotFound


@dataclass(frozen=True, slots=True)
class GiteaAsk:
    """What a verb asked of Gitea, in the words of its refusal.

    ``what`` completes "Gitea refused to ..." and "Gitea could not ..." (e.g. ``merge PR #3``); ``refused_because``
    says why Gitea refuses such a request (its 400/422 cases); ``after_failure`` what stands when no answer came
    (nothing recorded, or a retry adopts what Gitea did); ``retry`` and ``read_state`` are the exact next actions
    after a failure and after a refusal.
    """

    what: str
    refused_because: str
    after_failure: str
    retry: str
    read_state: str


def gitea_refusal(exc: GiteaError, ask: GiteaAsk) -> Envelope:
    """The envelope for ``exc``: Gitea refused the content (400/422) → ``invalid_state``; the account may not
    (401/403) → ``not_authorized``; the object is gone (404) → ``not_found``; it changed meanwhile (409) →
    ``conflict``; no usable answer (5xx, timeouts, lost connections) → ``unavailable``, retryable."""
    status = {"gitea_status": exc.status} if exc.status is not None else {}
    if isinstance(exc, GiteaInvalid):
        return Envelope("invalid_state", f"Gitea refused to {ask.what}: {exc.message}", ask.refused_because,
                        ask.read_state, details=status)
    if isinstance(exc, GiteaForbidden):
        return Envelope("not_authorized", f"Gitea does not let this account {ask.what}: {exc.message}",
                        "An operator must give the account the permission on the repository (or fix its token).",
                        ask.read_state, details=status)
    if isinstance(exc, GiteaNotFound):
        return Envelope("not_found", f"Gitea could not {ask.what}: {exc.message} (not found)",
                        "What the request names is gone on Gitea (deleted, renamed, or not visible to the account).",
                        ask.read_state, details=status)
    if isinstance(exc, GiteaConflict):
        return Envelope("conflict", f"Gitea could not {ask.what}: it changed meanwhile ({exc.message})",
                        "Read it again and decide on what it is now.", ask.read_state, details=status)
    return Envelope("unavailable", f"Gitea could not {ask.what}: {exc}", ask.after_failure, ask.retry)
