"""StateChange: the one builder of the intents that move an issue's state on Gitea (bot/core/intents.py)."""

from __future__ import annotations

from bot.core.canonical import CanonicalState
from bot.core.evidence import find_marker
from bot.core.intents import StateChange


def state(name: str) -> CanonicalState:
    return CanonicalState(state=name, who_is_next="human", next_action="look", next_prompt="", what_happened="x",
                          why="y", related_prs=(), blockers="none", validation="z", last_updated_by="foreman")


def test_the_label_follows_the_state_then_the_assignees_then_the_evidence() -> None:
    intents = StateChange(repo="acme/widgets", issue_number=7, state=state("blocked"), summary="Blocked.",
                          evidence={"action": "t"}, comment_key="k", labels_key="k:labels",
                          leaving=("ready", "in-progress"), assignees_key="k:assignee", assignees=(),
                          cause="d1").intents()
    assert [(i.key, i.kind) for i in intents] == [("k:labels", "labels"), ("k:assignee", "assignees"),
                                                  ("k", "comment")]
    assert intents[0].payload == {"add": ["status:blocked"], "remove": ["status:ready", "status:in-progress"]}
    assert intents[1].payload == {"assignees": []}
    assert find_marker(intents[2].payload["body"]) == "k" and "Blocked." in intents[2].payload["body"]
    assert {(i.repo, i.issue_number, i.delivery_id) for i in intents} == {("acme/widgets", 7, "d1")}


def test_without_a_label_or_assignee_key_only_the_evidence_goes() -> None:
    [comment] = StateChange(repo="acme/widgets", issue_number=7, state=state("in-progress"), summary="Kept.",
                            evidence={}, comment_key="k:failure").intents()
    assert comment.kind == "comment" and comment.key == "k:failure"
