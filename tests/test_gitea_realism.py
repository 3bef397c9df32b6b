"""Gitea as it really is (issue 14): each behaviour read in Gitea's source, reproduced by the emulator, and
the bot's answer to it, end to end through a running foreman service.

Every test names the Gitea file and function the emulator's behaviour comes from (see
docs/gitea-compatibility.md for the full list, with versions)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.gitea_fixtures import OWNER, REPO
from tests.support import Started
from tests.world import FULL_NAME, World, open_world


@pytest.fixture
async def world(tmp_path: Path, start: Started) -> AsyncIterator[World]:
    async with open_world(tmp_path, start) as opened:
        yield opened


# --------------------------------------------------------------------------- item 2: label_cleared


async def test_label_cleared_is_read_as_no_labels_though_the_payload_lists_the_old_ones(world: World) -> None:
    """models/issues/issue_label.go clearIssueLabels loads the labels, deletes them and never reloads, and
    services/webhook/notifier.go IssueClearLabels converts that stale list: the payload names the labels from
    before the clear. The bot must store "no labels" (so the issue is no candidate any more)."""
    number = await world.open_issue()
    await world.call("alice", "POST", f"/issues/{number}/labels", {"labels": ["status:ready", "bug"]})
    assert (await world.snapshot(number)).candidate
    await world.call("alice", "DELETE", f"/issues/{number}/labels")
    [cleared] = [d for d in world.live.emulator.deliveries if d.action == "label_cleared"]
    assert sorted(label["name"] for label in cleared.payload["issue"]["labels"]) == ["bug", "status:ready"]
    assert world.labels(number) == []
    snap = await world.snapshot(number)
    assert snap.label_names == () and not snap.candidate
    events = await world.store.issue_events(FULL_NAME, number)
    assert (events[-1]["action"], events[-1]["removed"]) == ("label_cleared", ["bug", "status:ready"])
