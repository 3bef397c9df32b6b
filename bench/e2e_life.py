"""The whole life in the end-to-end benchmark: label -> merged -> torn down, issue after issue (``--life``)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.e2e import REPO_KEY, _ms, _outbox_done, _query, memory_kib, p50_of, percentile, summary
from bot.core.evidence import find_marker
from bot.core.teardown import pull_key
from bot.demo import open_harness
from bot.demo_harness import (
    AUTHOR,
    BOT,
    FULL_NAME,
    LIFE_ROSTER,
    MAINTAINER,
    MERGER,
    OWNER,
    REPO,
    REVIEWER,
    LoopHarness,
    StepFailed,
    call_tool,
    mcp_session,
    until,
)
from bot.emulator import pullgit
from bot.gitops.remote import auth_env

MILESTONES = ("bootstrap_evidence_verified", "published", "pull_request_opened", "approved", "merged", "torn_down")
#: Issue 35: each life's latency flat over the run (the last fifth's p50 at most 1.2x the first fifth's, teardown in
#: the loop), and foreman serve's RSS flat within 10 MiB after warm-up (from the end of the first fifth to the end).
LIFE_FLAT_TARGET, RSS_GROWTH_TARGET_MIB = 1.2, 10.0
#: Each milestone's field on LifeSample, by the name the report gives it.
MILESTONE_FIELDS = dict(zip(MILESTONES, ("evidence_ms", "published_ms", "pr_ms", "approved_ms", "merged_ms",
                                         "torn_down_ms"), strict=True))
LIFE_STEPS = ("worktree_add", "commit", "push", "pr_create", "review", "merge")


@dataclass
class LifeSample:
    issue: int
    pull: int
    evidence_ms: float  # the bootstrap's evidence comment verified (the author may start)
    published_ms: float  # gitea_publish_worktree answered (commit pushed)
    pr_ms: float  # gitea_open_pull_request answered
    approved_ms: float  # the controller allocated the review and gitea_submit_review (approve) answered
    merged_ms: float  # gitea_merge_pull_request answered: label -> merged
    torn_down_ms: float  # the teardown's final evidence comment verified: label -> torn down
    serve_hwm_kib: int = 0  # foreman serve's peak RSS so far (VmHWM), read after the life
    serve_rss_kib: int = 0  # foreman serve's RSS then (VmRSS)


@dataclass
class LifeRun:
    samples: list[LifeSample] = field(default_factory=list)
    bare_ms: dict[str, list[float]] = field(default_factory=lambda: {step: [] for step in LIFE_STEPS})
    errors: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    serve_peak_rss_kib: int = 0
    deliveries: int = 0
    deliveries_refused: list[str] = field(default_factory=list)  # what foreman answered, when not 2xx


async def _bootstrapped(h: LoopHarness, n: int, timeout_s: float) -> dict[str, Any]:
    async def probe() -> dict[str, Any] | None:
        # Named by repository, each table a seek (bootstrap_journal_issue, outbox_idempotency_key): without it the
        # probe, polled every 20 ms, read every 'done' outbox entry, a scan that grew with the lives (issue 35).
        rows = _query(h, "SELECT j.worktree_path, o.sent_at FROM bootstrap_journal j JOIN outbox o"
                         " ON o.repo = j.repo AND o.idempotency_key = j.idempotency_key || ':evidence'"
                         " WHERE j.repo = ? AND j.issue_number = ? AND j.phase = 'completed' AND o.status = 'done'",
                      (REPO_KEY, n))
        return rows[0] if rows else None

    return await until("bootstrap", probe, timeout_s, f"#{n}: no verified bootstrap evidence comment")


async def _one_life(h: LoopHarness, sessions: dict[str, Any], n: int, timeout_s: float) -> LifeSample:
    """One issue's whole life through ``foreman mcp`` as each identity, as tests/test_whole_life.py drives it."""
    t0 = time.time()

    def since() -> float:
        return (time.time() - t0) * 1000.0

    await h.api(MAINTAINER, "POST", f"/issues/{n}/labels", {"labels": ["status:ready"]})
    boot = await _bootstrapped(h, n, timeout_s)
    author = sessions[AUTHOR]
    # The author reads what it is to do (the issue's title and body, through the door) before it starts.
    issue = await call_tool(author, "read issue", "gitea_read_issue", issue_number=n)
    if not issue.get("title") or issue.get("state") != "open":
        raise StepFailed("read issue", f"#{n} read as {issue.get('title')!r}, {issue.get('state')!r}")
    await call_tool(author, "lock", "gitea_lock_issue", issue_number=n)
    Path(boot["worktree_path"], "life", f"issue-{n}.txt").parent.mkdir(exist_ok=True)
    Path(boot["worktree_path"], "life", f"issue-{n}.txt").write_text(f"issue {n}\n", encoding="utf-8")
    await call_tool(author, "publish", "gitea_publish_worktree", issue_number=n, message=f"Life of #{n}")
    published_ms = since()
    opened = await call_tool(author, "pr", "gitea_open_pull_request", issue_number=n)
    pr_ms = since()
    # Opening the PR ended the author's lease (the hand-over): no release. The review allocation reads its
    # candidates from Gitea, where foreman's outbox puts status:review (a label sync never acts on an older state).

    async def in_review() -> bool | None:
        seen = await h.api(MAINTAINER, "GET", f"/issues/{n}")
        return True if [label["name"] for label in seen["labels"]] == ["status:review"] else None

    await until("review", in_review, timeout_s, f"#{n} never showed status:review")
    # Nobody allocates: the review queue hands the review to the reviewer, the merge queue the approved PR to the
    # merger; each agent learns it from its runtime context.
    await _handed(sessions[REVIEWER], "review", n, timeout_s)
    # The reviewer reads the diff and the files it approves.
    pull = await call_tool(sessions[REVIEWER], "read pull", "gitea_read_pull_request", issue_number=n)
    if f"life/issue-{n}.txt" not in pull["diff"]["files"] or f"+issue {n}" not in pull["diff"]["text"]:
        raise StepFailed("read pull", f"the diff of #{n} does not show life/issue-{n}.txt: {pull['diff']['files']}")
    await call_tool(sessions[REVIEWER], "review", "gitea_submit_review", issue_number=n, verdict="approve")
    approved_ms = since()
    await _handed(sessions[MERGER], "merge", n, timeout_s)
    await call_tool(sessions[MERGER], "merge", "gitea_merge_pull_request", issue_number=n)
    merged_ms = since()
    pr = int(opened["pull_request"])
    key = f"{pull_key(FULL_NAME.lower(), n, pr)}:evidence"

    async def torn_down() -> dict[str, Any] | None:
        labels = _outbox_done(h, key.removesuffix(":evidence") + ":labels")
        return _outbox_done(h, key) if labels is not None else None

    final = await until("teardown", torn_down, timeout_s, f"#{n}: the teardown's evidence was never verified")
    return LifeSample(issue=n, pull=pr, evidence_ms=_ms(boot["sent_at"], t0), published_ms=published_ms,
                      pr_ms=pr_ms, approved_ms=approved_ms, merged_ms=merged_ms,
                      torn_down_ms=_ms(final["sent_at"], t0))


async def _git(h: LoopHarness, *args: str, cwd: Path, env: dict[str, str] | None = None) -> None:
    """git without blocking the event loop (the emulator serving git's HTTP runs in it)."""
    proc = await asyncio.create_subprocess_exec("git", *args, cwd=cwd, env={**os.environ, **(env or {})},
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    if proc.returncode != 0:
        raise StepFailed("baseline", f"git {' '.join(args)}: {err.decode(errors='replace').strip()}")


async def _commit(h: LoopHarness, path: Path, name: str, message: str) -> None:
    await _git(h, "add", name, cwd=path)
    await _git(h, "-c", "user.name=bench", "-c", "user.email=bench@foreman.invalid", "commit", "-q", "--no-verify",
               "-m", message, cwd=path)


async def _life_baselines(h: LoopHarness, run: LifeRun, k: int) -> None:
    """The bare operations of one life, timed directly with the hook off: worktree add, a commit, a push over HTTP
    with the bot's token, the PR (as the author), an approval (as the reviewer) and the merge (as the merger)."""
    branch, path = f"bench-life-baseline-{k}", h.root / "baseline" / f"life-{k}"
    hook = next(hook for hook in h.emulator.repo(OWNER, REPO).hooks if hook.id == h.hook_id)
    hook.active = False
    timed = run.bare_ms

    async def step(name: str, work: Awaitable[Any]) -> Any:
        started = time.perf_counter()
        out = await work
        timed[name].append((time.perf_counter() - started) * 1000.0)
        return out

    try:
        await step("worktree_add", _git(h, "worktree", "add", "-q", "-b", branch, str(path), "origin/main",
                                        cwd=h.checkout))
        (path / f"baseline-{k}.txt").write_text(f"baseline {k}\n", encoding="utf-8")
        await step("commit", _commit(h, path, f"baseline-{k}.txt", f"Baseline {k}"))
        await step("push", _git(h, "push", "-q", "origin", branch, cwd=path, env=auth_env(h.gitea_url, h.tokens[BOT])))
        pull = await step("pr_create", h.api(AUTHOR, "POST", "/pulls", {"head": branch, "base": "main",
                                                                         "title": f"Baseline {k}", "body": "bench"}))
        head = pull["head"]["sha"]
        await step("review", h.api(REVIEWER, "POST", f"/pulls/{pull['number']}/reviews",
                                   {"event": "APPROVED", "commit_id": head}))
        await step("merge", h.api(MERGER, "POST", f"/pulls/{pull['number']}/merge",
                                  {"Do": "merge", "head_commit_id": head}))
    finally:
        hook.active = True
    await _git(h, "worktree", "remove", "--force", str(path), cwd=h.checkout)
    await _git(h, "branch", "-q", "-D", branch, cwd=h.checkout)
    await h.api(MAINTAINER, "DELETE", f"/branches/{branch}")


async def _handed(session: Any, action: str, n: int, timeout_s: float) -> dict[str, Any]:
    """The agent's lease on #``n`` for ``action`` once its runtime context shows the queue handed it one."""
    async def leased() -> dict[str, Any] | None:
        context = await call_tool(session, action, "gitea_get_runtime_context")
        found = next((lease for lease in context.get("leases") or ()
                      if (lease.get("issue_number"), lease.get("action")) == (n, action)), None)
        if found is None:
            await asyncio.sleep(0.05)  # the queue runs off the caller's path
        return found

    found = await until(action, leased, timeout_s, f"the {action} queue never leased #{n}")
    assert isinstance(found, dict)
    return found


async def _check_life(h: LoopHarness, run: LifeRun) -> None:
    emu = h.emulator
    for s in run.samples:
        leases = _query(h, "SELECT owner, action, status FROM leases WHERE issue_number = ? ORDER BY acquired_at",
                        (s.issue,))
        if [(r["owner"], r["action"], r["status"] != "live") for r in leases] != [
                (AUTHOR, "implement", True), (REVIEWER, "review", True), (MERGER, "merge", True)]:
            run.errors.append(f"#{s.issue}: leases {[tuple(r) for r in leases]}")
        journal = _query(h, "SELECT worktree_path, branch FROM bootstrap_journal WHERE issue_number = ?", (s.issue,))
        if len(journal) != 1 or Path(journal[0]["worktree_path"]).exists():
            run.errors.append(f"#{s.issue}: worktree left {[tuple(r) for r in journal]}")
        elif pullgit.branch_sha(emu.repo(OWNER, REPO).path, journal[0]["branch"]) is not None:
            run.errors.append(f"#{s.issue}: branch {journal[0]['branch']} not deleted")
        issue = emu.issue(OWNER, REPO, s.issue)
        labels = sorted(label["name"] for label in (await h.api(MAINTAINER, "GET", f"/issues/{s.issue}"))["labels"])
        record = emu.pull_of(emu.issue(OWNER, REPO, s.pull))
        if labels != ["status:done"] or issue.closed is None or record.merged is None:
            run.errors.append(f"#{s.issue}: labels {labels}, closed {issue.closed}, PR merged {record.merged}")
        markers = Counter(find_marker(c.body) for c in issue.comments if c.poster.login == BOT)
        if sum(1 for m in markers if m and m.startswith("teardown:")) != 1 or any(
                count != 1 for m, count in markers.items() if m):
            run.errors.append(f"#{s.issue}: comments {dict(markers)}")
    pending = _query(h, "SELECT idempotency_key, status FROM outbox WHERE status != 'done'")
    run.errors.extend(f"outbox {r['idempotency_key']} is {r['status']}" for r in pending)
    failed = _query(h, "SELECT delivery_id FROM deliveries WHERE status = 'failed'")
    run.errors.extend(f"delivery {r['delivery_id']} failed" for r in failed)


async def bench_life(issues: int, baseline_samples: int, timeout_s: float, root: Path) -> LifeRun:
    run = LifeRun()
    async with open_harness(root, life=True) as h:
        await h.start_serve(timeout_s)
        await h.register_hook(("issues", "pull_request"))
        numbers = [int((await h.api(MAINTAINER, "POST", "/issues", {"title": f"Life issue {i + 1}",
                                                                      "body": "bench"}))["number"])
                   for i in range(issues)]

        async def opened() -> bool | None:
            rows = _query(h, "SELECT COUNT(*) AS c FROM deliveries WHERE action = 'opened' AND status = 'done'")
            return True if rows[0]["c"] == issues else None

        await until("setup", opened, timeout_s + issues * 0.1, "the opened webhooks were never all handled")
        every = max(1, issues // max(1, baseline_samples))
        async with contextlib.AsyncExitStack() as stack:
            errlog = stack.enter_context((root / "mcp.log").open("w", encoding="utf-8"))
            sessions = {login: await stack.enter_async_context(mcp_session(h, errlog, login))
                        for login in LIFE_ROSTER}
            started = time.monotonic()
            for i, n in enumerate(numbers):
                sample = await _one_life(h, sessions, n, timeout_s)
                sample.serve_hwm_kib, sample.serve_rss_kib = memory_kib(h.serve.pid if h.serve else None)
                run.samples.append(sample)
                _progress(run.samples, issues)
                if i == 0 or (i % every == 0 and len(run.bare_ms["merge"]) < baseline_samples):
                    pause = time.monotonic()
                    await _life_baselines(h, run, len(run.bare_ms["merge"]))
                    started += time.monotonic() - pause  # the baselines are not part of the life's wall time
            run.wall_s = time.monotonic() - started
        while len(run.bare_ms["merge"]) < baseline_samples:
            await _life_baselines(h, run, len(run.bare_ms["merge"]))
        await h.emulator.drain_webhooks()
        await _check_life(h, run)
        run.deliveries = len(h.emulator.deliveries)
        run.deliveries_refused = [f"{d.event_type} {d.status}" for d in h.emulator.deliveries if not d.ok]
        assert h.serve is not None
        run.serve_peak_rss_kib = memory_kib(h.serve.pid)[0]
    return run


def life_report(run: LifeRun, issues: int) -> dict[str, Any]:
    merged_ms = summary([s.merged_ms for s in run.samples])
    torn_down = summary([s.torn_down_ms for s in run.samples])
    bare = {step: summary(values) for step, values in run.bare_ms.items()}
    bare_sum = sum(statistics.median(values) for values in run.bare_ms.values())
    return {
        "mode": "life",
        "issues": issues,
        "ok": not run.errors,
        "errors": run.errors[:20],
        "label_to_merged_ms": merged_ms,
        "label_to_torn_down_ms": torn_down,
        "milestones_p50_ms": {
            **p50_of(run.samples, bootstrap_evidence_verified="evidence_ms", published="published_ms",
                     pull_request_opened="pr_ms", approved="approved_ms"),
            "merged": merged_ms["p50"],
            "torn_down": torn_down["p50"],
        },
        "wall_s": run.wall_s,
        "throughput_per_min": issues * 60.0 / run.wall_s if run.wall_s else 0.0,
        "bare_ms": {**bare, "sum_of_medians": bare_sum},
        "ratio_merged_p50_to_bare": merged_ms["p50"] / bare_sum,
        "ratio_torn_down_p50_to_bare": torn_down["p50"] / bare_sum,
        # Reported, not a failed check: SQLite's lock is shared by foreman serve and the four `foreman mcp`.
        "deliveries": run.deliveries,
        "deliveries_refused": len(run.deliveries_refused),
        "deliveries_refused_sample": run.deliveries_refused[:10],
        "peak_rss_mib": {
            "bench_process_with_emulator": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
            "foreman_serve": run.serve_peak_rss_kib / 1024.0,
        },
        **by_fifth(run.samples),
        "measured_at": datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def _progress(samples: list[LifeSample], issues: int) -> None:
    """At the end of each fifth of a run, one line on stderr with that fifth's figures (a long run that does not
    finish still says how far it got and how it was going)."""
    done = len(samples)
    k = next((k for k in range(1, 6) if k * issues // 5 == done), None)
    if k is None:
        return
    part = samples[(k - 1) * issues // 5: done]
    print(f"fifth {k} (lives {(k - 1) * issues // 5 + 1}-{done}): p50 label -> merged"
          f" {percentile([s.merged_ms for s in part], 50):.0f} ms, -> torn down"
          f" {percentile([s.torn_down_ms for s in part], 50):.0f} ms; serve RSS {part[-1].serve_rss_kib / 1024:.1f}"
          f" MiB, peak {part[-1].serve_hwm_kib / 1024:.1f} MiB ({datetime.now():%H:%M:%S})",
          file=sys.stderr, flush=True)


def by_fifth(samples: list[LifeSample]) -> dict[str, Any]:
    """Does a life slow down, or foreman serve's memory grow, as lives accumulate? Each fifth of the run (in order):
    the p50 of every milestone, and serve's RSS and peak RSS after the fifth's last life."""
    size = len(samples)
    fifths = [part for k in range(5) if (part := samples[k * size // 5: (k + 1) * size // 5])]
    milestones = {name: [percentile([getattr(s, field) for s in part], 50) for part in fifths]
                  for name, field in MILESTONE_FIELDS.items()}
    rss = [part[-1].serve_rss_kib / 1024.0 for part in fifths]
    growth = rss[-1] - rss[0]
    flat = {name: milestones[name][-1] / milestones[name][0] for name in ("merged", "torn_down")}
    return {
        "fifths": [len(part) for part in fifths],
        "milestones_p50_by_fifth_ms": milestones,
        "serve_rss_by_fifth_mib": rss,
        "serve_hwm_by_fifth_mib": [part[-1].serve_hwm_kib / 1024.0 for part in fifths],
        "flat_ratio": flat,
        "flat_target": LIFE_FLAT_TARGET,
        "flat_pass": {name: ratio <= LIFE_FLAT_TARGET for name, ratio in flat.items()},
        "serve_rss_growth_mib": growth,
        "serve_rss_growth_target_mib": RSS_GROWTH_TARGET_MIB,
        "serve_rss_growth_pass": growth <= RSS_GROWTH_TARGET_MIB,
    }


def by_fifth_text(doc: dict[str, Any]) -> list[str]:
    """The per-fifth lines of the report, with the issue-35 targets."""
    ms, flat, target = doc["milestones_p50_by_fifth_ms"], doc["flat_ratio"], doc["flat_target"]
    verdict = {True: "PASS", False: "MISS"}
    return [
        "p50 by fifth of the run (" + "/".join(str(n) for n in doc["fifths"]) + " lives):",
        *(f"  {name.replace('_', ' ')}: " + ", ".join(f"{v:.0f}" for v in ms[name]) + " ms" for name in MILESTONES),
        *(f"flat: last fifth / first fifth p50 label -> {name.replace('_', ' ')} {flat[name]:.2f}x"
          f" (target <= {target:.1f}x): {verdict[doc['flat_pass'][name]]}" for name in ("merged", "torn_down")),
        "foreman serve at the end of each fifth: RSS (VmRSS) "
        + ", ".join(f"{v:.1f}" for v in doc["serve_rss_by_fifth_mib"]) + " MiB; peak (VmHWM) "
        + ", ".join(f"{v:.1f}" for v in doc["serve_hwm_by_fifth_mib"]) + " MiB",
        f"serve RSS after warm-up (end of fifth 1 → end): {doc['serve_rss_growth_mib']:+.1f} MiB"
        f" (target <= {doc['serve_rss_growth_target_mib']:.0f} MiB): {verdict[doc['serve_rss_growth_pass']]}",
    ]


def life_text(doc: dict[str, Any]) -> str:
    merged_ms, down, ms, bare, rss = (doc["label_to_merged_ms"], doc["label_to_torn_down_ms"],
                                      doc["milestones_p50_ms"], doc["bare_ms"], doc["peak_rss_mib"])
    return "\n".join([
        f"e2e whole life: {doc['issues']} issues, one after another, through `foreman mcp` as controller, author,"
        " reviewer and merger (each with its own Gitea token)",
        f"label -> merged: p50 {merged_ms['p50']:.0f} ms, p99 {merged_ms['p99']:.0f} ms (mean {merged_ms['mean']:.0f},"
        f" min {merged_ms['min']:.0f}, max {merged_ms['max']:.0f})",
        f"label -> torn down (final evidence comment verified): p50 {down['p50']:.0f} ms, p99 {down['p99']:.0f} ms"
        f" (mean {down['mean']:.0f}, min {down['min']:.0f}, max {down['max']:.0f})",
        "  p50 milestones: " + ", ".join(f"{name.replace('_', ' ')} {ms[name]:.0f} ms" for name in MILESTONES),
        f"throughput: {doc['throughput_per_min']:.1f} issues/minute ({doc['issues']} whole lives in"
        f" {doc['wall_s']:.1f} s)",
        f"same-run bare operations (medians of {bare['merge']['n']}): "
        + ", ".join(f"{step.replace('_', ' ')} {bare[step]['p50']:.1f} ms" for step in LIFE_STEPS)
        + f"; sum {bare['sum_of_medians']:.1f} ms",
        f"ratio p50 / bare: merged {doc['ratio_merged_p50_to_bare']:.1f}x, torn down"
        f" {doc['ratio_torn_down_p50_to_bare']:.1f}x",
        f"peak RSS: foreman serve {rss['foreman_serve']:.0f} MiB, this process (with the emulator)"
        f" {rss['bench_process_with_emulator']:.0f} MiB",
        *by_fifth_text(doc),
        f"webhook deliveries foreman did not accept (2xx): {doc['deliveries_refused']} of {doc['deliveries']}",
        "checks: two ended leases (author, reviewer), worktree removed, branch deleted, status:done, issue closed,"
        " PR merged, one teardown comment and one comment per marker; outbox all done; no failed delivery: "
        + ("PASS" if doc["ok"] else "FAIL"),
        *(f"  {error}" for error in doc["errors"]),
    ])
