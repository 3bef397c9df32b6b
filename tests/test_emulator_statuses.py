"""The emulator's commit statuses as Gitea's source has them (routers/api/v1/repo/status.go,
services/convert/status.go, services/pull/commit_status.go) and the ``status`` webhook (1.23+)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bot.emulator.pullgit import branch_sha
from tests.gitea_fixtures import BOT, HOOK_SECRET, OWNER, REPO, LiveEmulator, live_emulator, webhook_sink

VERSIONS = ["1.22.3", "1.26.3"]


async def _call(live: LiveEmulator, method: str, path: str, *, login: str = BOT, body: Any = None) -> tuple[int, Any]:
    url = live.api(f"/repos/{OWNER}/{REPO}{path}")
    async with live.session.request(method, url, json=body, headers=live.auth(login)) as response:
        raw = await response.read()
        return response.status, json.loads(raw) if raw else None


def _main(live: LiveEmulator) -> str:
    sha = branch_sha(live.emulator.repo(OWNER, REPO).path, "main")
    assert sha is not None
    return sha


@pytest.mark.parametrize("version", VERSIONS)
async def test_creating_a_status_needs_write_and_answers_the_commit_status(version: str) -> None:
    """``NewCommitStatus`` behind ``reqRepoWriter(code)``: a reader 403; a writer 201 with ``id`` the per-commit
    index, ``status`` the state, trimmed fields; the path may be a branch (``GetCommit``), stored as the full
    sha; an unknown revision is a 500 with an empty message for non-admins."""
    async with live_emulator(version=version) as live:
        sha = _main(live)
        status, data = await _call(live, "POST", f"/statuses/{sha}", login="bob", body={"state": "success"})
        assert (status, data["message"]) == (403, "user should have a permission to write to a repo")
        form = {"state": "pending", "context": " ci/build ", "description": " d ", "target_url": "https://ci/1"}
        status, made = await _call(live, "POST", "/statuses/main", login="alice", body=form)
        assert status == 201
        assert (made["id"], made["status"], made["context"], made["description"]) == (1, "pending", "ci/build", "d")
        assert made["url"].endswith(f"/api/v1/repos/{OWNER}/{REPO}/statuses/{sha}")
        assert made["creator"]["login"] == "alice" and made["created_at"] == made["updated_at"]
        status, data = await _call(live, "POST", "/statuses/nope", body={"state": "success"})
        assert (status, data["message"]) == (500, "")


@pytest.mark.parametrize("version", VERSIONS)
async def test_status_lists_are_newest_first_and_filter_by_state(version: str) -> None:
    """``getCommitStatuses``: newest first, ``sort=oldest``, ``state`` filter, ``X-Total-Count``;
    ``/statuses/{sha}`` takes the sha as given from 1.23 (a branch lists nothing) but 1.22 resolves it;
    ``/commits/{ref}/statuses`` resolves a branch in both."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        sha = _main(live)
        emu.set_commit_status(OWNER, REPO, sha, context="a", state="pending")
        emu.set_commit_status(OWNER, REPO, sha, context="a", state="success")
        emu.set_commit_status(OWNER, REPO, sha, context="b", state="failure")
        status, listed = await _call(live, "GET", f"/statuses/{sha}")
        assert status == 200 and [s["id"] for s in listed] == [3, 2, 1]
        assert [s["id"] for s in (await _call(live, "GET", f"/statuses/{sha}?sort=oldest"))[1]] == [1, 2, 3]
        assert [s["id"] for s in (await _call(live, "GET", f"/statuses/{sha}?state=success"))[1]] == [2]
        by_branch = (await _call(live, "GET", "/statuses/main"))[1]
        assert len(by_branch) == (0 if version.startswith("1.26") else 3)
        assert len((await _call(live, "GET", "/commits/main/statuses"))[1]) == 3


@pytest.mark.parametrize("version", VERSIONS)
async def test_the_combined_status_takes_the_latest_per_context_and_combines_as_the_version_does(version: str) -> None:
    """``GetCombinedCommitStatusByRef``: the latest status per context. 1.26 ``CalcCommitStatus`` (a warning
    is failure), ``commit_url``/``url`` set; 1.22 the worst state (warning stays warning), no urls."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        sha = _main(live)
        emu.set_commit_status(OWNER, REPO, sha, context="a", state="failure")
        emu.set_commit_status(OWNER, REPO, sha, context="a", state="success")
        emu.set_commit_status(OWNER, REPO, sha, context="b", state="warning")
        status, combined = await _call(live, "GET", "/commits/main/status")
        assert status == 200
        assert combined["sha"] == sha and combined["total_count"] == 2
        assert [(s["context"], s["status"]) for s in combined["statuses"]] == [("a", "success"), ("b", "warning")]
        if version.startswith("1.26"):
            assert combined["state"] == "failure"
            assert combined["url"].endswith(f"/repos/{OWNER}/{REPO}/commits/{sha}/status")
        else:
            assert combined["state"] == "warning" and combined["url"] == "" and combined["commit_url"] == ""


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_commit_without_statuses_and_an_unknown_ref_differ_by_version(version: str) -> None:
    """1.26 ``ToCombinedStatus`` with no statuses: ``pending``, ``statuses`` null, the repository; an unknown ref
    404 (``resolveRefCommit``). 1.22: an empty ``CombinedStatus`` (all zero, repository null) for both."""
    async with live_emulator(version=version) as live:
        status, combined = await _call(live, "GET", "/commits/main/status")
        unknown, data = await _call(live, "GET", "/commits/no-such-ref/status")
        if version.startswith("1.26"):
            assert (status, combined["state"], combined["statuses"]) == (200, "pending", None)
            assert combined["total_count"] == 0
            assert combined["repository"]["full_name"] == f"{OWNER}/{REPO}"
            assert unknown == 404 and data["errors"] == ["object does not exist [id: no-such-ref, rel_path: ]"]
        else:
            empty = {"state": "", "sha": "", "total_count": 0, "statuses": None, "repository": None,
                     "commit_url": "", "url": ""}
            assert (status, combined) == (200, empty)
            assert (unknown, data) == (200, empty)


@pytest.mark.parametrize("version", VERSIONS)
async def test_a_new_status_sends_the_status_webhook_from_1_23(version: str) -> None:
    """services/webhook/notifier.go ``CreateCommitStatus`` (#27151, 1.23.0): X-Gitea-Event ``status`` with
    ``api.CommitStatusPayload`` (the row id, UTC times, the commit); 1.22 has no such event."""
    async with live_emulator(version=version) as live, webhook_sink() as sink:
        emu = live.emulator
        emu.add_hook(OWNER, REPO, url=sink.url, secret=HOOK_SECRET, events=["status"])
        sha = _main(live)
        status, _ = await _call(live, "POST", f"/statuses/{sha}", body={"state": "success", "context": "ci"})
        assert status == 201
        deliveries = await emu.drain_webhooks()
        if not version.startswith("1.26"):
            assert deliveries == []
            return
        [delivery] = deliveries
        assert delivery.headers["X-Gitea-Event"] == "status"
        payload = delivery.payload
        assert list(payload) == ["commit", "context", "created_at", "description", "id", "repository", "sender",
                                 "sha", "state", "target_url", "updated_at"]
        assert (payload["sha"], payload["state"], payload["context"]) == (sha, "success", "ci")
        assert payload["commit"]["id"] == sha and payload["created_at"].endswith("Z")
        assert payload["target_url"] == emu.app_url and payload["sender"]["login"] == BOT


@pytest.mark.parametrize("version", VERSIONS)
async def test_required_status_checks_gate_the_merge(version: str) -> None:
    """``IsPullCommitStatusPass`` → ``MergeRequiredContextsCommitStatus`` over the head's latest statuses with
    glob contexts: none yet, or pending, is 405 "Not all required status checks successful" (1.22 wrapped);
    success on every required context merges."""
    async with live_emulator(version=version) as live:
        emu = live.emulator
        head = emu.create_branch(OWNER, REPO, "feat", files={"f.txt": "f\n"})
        pr = emu.create_pull(OWNER, REPO, head="feat", title="Feat", author="alice")
        emu.protect_branch(OWNER, REPO, "main", enable_status_check=True, status_check_contexts=["ci/*"])
        reason = "Not all required status checks successful"
        message = reason if version.startswith("1.26") else f"not allowed to merge [reason: {reason}]"
        merge = {"Do": "merge"}
        assert await _call(live, "POST", f"/pulls/{pr.number}/merge", body=merge) == (405, {
            "message": message, "url": f"{emu.app_url}api/swagger"})
        emu.set_commit_status(OWNER, REPO, head, context="ci/build", state="pending")
        assert (await _call(live, "POST", f"/pulls/{pr.number}/merge", body=merge))[0] == 405
        emu.set_commit_status(OWNER, REPO, head, context="ci/build", state="success")
        assert (await _call(live, "POST", f"/pulls/{pr.number}/merge", body=merge))[0] == 200
