"""The one mapping from a failed Gitea call to a verb's refusal (bot/verbs/gitea_refusals.py)."""

from __future__ import annotations

import pytest

from bot.gitea.errors import GiteaError, error_for
from bot.verbs.gitea_refusals import GiteaAsk, gitea_refusal

ASK = GiteaAsk(what="merge PR #3", refused_because="Gitea refuses a conflicting PR.",
               after_failure="A retry adopts a merge Gitea did make.", retry="call gitea_merge_pull_request again",
               read_state="call gitea_get_issue_state with issue_number=7")


@pytest.mark.parametrize(("status", "kind", "next_action"), [
    (400, "invalid_state", ASK.read_state),
    (422, "invalid_state", ASK.read_state),
    (401, "not_authorized", ASK.read_state),
    (403, "not_authorized", ASK.read_state),
    (404, "not_found", ASK.read_state),
    (409, "conflict", ASK.read_state),
    (500, "unavailable", ASK.retry),
    (503, "unavailable", ASK.retry),
])
def test_what_gitea_answered_decides_the_kind_and_the_next_action(status: int, kind: str, next_action: str) -> None:
    """A refused request (4xx) is never called unavailable (retrying it changes nothing: opening a PR once
    answered a 422 with "unavailable, call again"); only a missing answer is."""
    envelope = gitea_refusal(error_for(status, "Gitea's reason", "POST", "/repos/o/r/pulls/3/merge"), ASK)
    assert (envelope.error, envelope.exact_next_action) == (kind, next_action)
    assert "merge PR #3" in envelope.message
    if status < 500:
        assert "Gitea's reason" in envelope.message and envelope.details == {"gitea_status": status}
    else:
        assert envelope.remediate == ASK.after_failure


def test_a_lost_connection_is_unavailable_and_names_no_status() -> None:
    envelope = gitea_refusal(GiteaError("connection reset", method="POST", path="/x"), ASK)
    assert envelope.error == "unavailable" and envelope.details == {} and "connection reset" in envelope.message


def test_a_refusals_reason_is_typed_and_leads_its_details_in_the_json() -> None:
    """The reason is a field of the envelope (checked against ``RefusalReason`` where it is built) and the JSON
    keeps its place: ``details.reason``, first."""
    from bot.core.errors import Envelope
    from bot.core.reasons import REFUSAL_REASONS

    refusal = Envelope("conflict", "m", "r", "n", details={"issue_number": 3}, reason="leased")
    assert refusal.reason == "leased" and "leased" in REFUSAL_REASONS
    assert list(refusal.to_dict()["details"].items()) == [("reason", "leased"), ("issue_number", 3)]
    assert "details" not in Envelope("conflict", "m", "r", "n").to_dict()
