"""`foreman demo`: the controller loop end to end against the bundled Gitea emulator, every step read back."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from bot.config_writer import Document, merged, write_config
from bot.core.canonical import parse_comment
from bot.core.evidence import find_marker
from bot.core.vocabulary import status_labels
from bot.demo_harness import (
    AUTHOR,
    BOT,
    CONTROLLER,
    FULL_NAME,
    LIFE_ROSTER,
    LIFE_USERS,
    MAINTAINER,
    MERGER,
    OWNER,
    REPO,
    REVIEWER,
    USERS,
    LoopHarness,
    Printer,
    StepFailed,
    call_tool,
    mcp_session,
    state_comment_id,
    until,
    verified,
    verified_comment,
)
from bot.demo_life import author_steps, review_merge_teardown
from bot.emulator import Emulator, start_emulator
from bot.emulator.model import Perm
from state.db import to_db_time
from state.deliveries import DeliveryStore, StoredDelivery
from state.issues import IssueStore
from state.journal import JournalStore, Transition
from state.leases import Lease, LeaseStore

#: What callers use of this module (``bot.demo.OWNER`` and ``REPO``, the repository it serves, are demo_harness's).
__all__ = [
    "OWNER", "REPO", "demo_config", "life_config", "main", "open_harness", "run_demo", "scratch_root", "seed_demo",
]

ISSUE_TITLE = "Make the widget blue"
ISSUE_BODY = "The widget should be blue.\n\nAcceptance: `widget.color` is `blue`."
EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def seed_demo(emu: Emulator, users: tuple[tuple[str, Perm, str], ...] = USERS) -> dict[str, str]:
    """``demo/widgets`` with its owner, ``users`` and foreman's status labels; each account's fresh API token by
    login."""
    tokens = {login: f"gitea-{login}-{secrets.token_hex(12)}" for login in (OWNER, *(user[0] for user in users))}
    emu.add_user(OWNER, token=tokens[OWNER], full_name="Demo organisation")
    for login, _, _ in users:
        emu.add_user(login, token=tokens[login])
    emu.create_repo(OWNER, REPO, files={"README.md": "# widgets\n", "widget.py": "color = 'grey'\n"},
                    description="foreman's demo repository")
    for login, permission, _ in users:
        emu.set_permission(OWNER, REPO, login, permission)
    for label in status_labels():
        emu.create_label(OWNER, REPO, label, color="#00aa00")
    return tokens


def scratch_root(prefix: str) -> Path:
    """A fresh directory, on tmpfs when the machine has one (git and SQLite are much faster there)."""
    shm = Path("/dev/shm")  # noqa: S108 (mkdtemp makes a private 0700 directory there)
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base))


def demo_config(gitea_url: str, tokens: Mapping[str, str], webhook_secret: str, root: Path, mcp_token: str
                ) -> dict[str, Any]:
    """The foreman.toml document for ``demo/widgets`` as ``seed_demo`` made it, its files under ``root``."""
    return {
        "webhook": {"secrets": [webhook_secret]},
        "database": {"path": root / "foreman.db"},
        "gitea": {"url": gitea_url, "token": tokens[BOT], "bot_login": BOT},
        "repository": {"owner": OWNER, "name": REPO, "checkout_root": root / "checkouts"},
        "roster": {CONTROLLER: ["controller"], AUTHOR: ["author"]},
        "mcp": {"tokens": {mcp_token: AUTHOR}},
    }


def life_config(h: LoopHarness) -> Document:
    """Laid over ``_config`` for the whole life: the four roster identities, each with its own tokens."""
    return {
        "roster": LIFE_ROSTER,
        "gitea": {"identity_tokens": {login: h.tokens[login] for login in LIFE_ROSTER}},
        "mcp": {"tokens": {h.mcp_tokens[login]: login for login in LIFE_ROSTER}},
    }


def _config(h: LoopHarness) -> dict[str, Any]:
    """``demo_config`` with the demo's own server and faster worker and outbox timings."""
    return merged(demo_config(h.gitea_url, h.tokens, h.webhook_secret, h.root, h.mcp_tokens[AUTHOR]), {
        "server": {"host": "127.0.0.1", "port": 0, "shutdown_grace_s": 2.0},
        "database": {"path": h.db_path, "synchronous": "NORMAL"},
        "gitea": {"timeout_s": 10.0},
        "worker": {"poll_interval_s": 0.05, "backoff_base_s": 0.2, "backoff_max_s": 2.0},
        "outbox": {"poll_interval_s": 0.05, "backoff_base_s": 0.1, "backoff_max_s": 2.0},
    })


@asynccontextmanager
async def open_harness(root: Path, *, config: Document | None = None, life: bool = False
                       ) -> AsyncIterator[LoopHarness]:
    """The emulator with ``demo/widgets`` on loopback and the config (``life_config`` when ``life``, then
    ``config``, laid over the demo's) for a foreman serve (not started yet)."""
    # Clone URLs over git smart HTTP (the emulator's git http-backend behind Gitea's auth rules), of a private
    # repository: the control checkout comes only with the bot's token, as from a real Gitea.
    emu = Emulator(root / "gitea", clone_protocol="http")
    tokens = seed_demo(emu, USERS + LIFE_USERS)
    emu.repo(OWNER, REPO).private = True
    runner, gitea_url = await start_emulator(emu)
    http = aiohttp.ClientSession()
    harness = LoopHarness(
        root=root,
        in_process=emu,
        runner=runner,
        gitea_url=gitea_url,
        http=http,
        tokens=tokens,
        mcp_tokens={login: f"mcp-{login}-{secrets.token_hex(12)}" for login in LIFE_ROSTER},
        webhook_secret=secrets.token_hex(24),
        config_path=root / "foreman.toml",
        db_path=root / "foreman.db",
        checkout=root / "checkouts" / OWNER / REPO,
        serve_log=root / "serve.log",
    )
    document = merged(_config(harness), life_config(harness)) if life else _config(harness)
    document = merged(document, config or {})
    harness.database_url = document["database"].get("url")
    if harness.database_url is not None:  # PostgreSQL: [database] url alone
        del document["database"]["path"]
    write_config(harness.config_path, document, comment="written by foreman demo")
    try:
        yield harness
    finally:
        await harness.stop()
        await http.close()
        await runner.cleanup()
        await emu.aclose()


# --- the demo ---------------------------------------------------------------------------------------------------------


async def _loop(h: LoopHarness, p: Printer, timeout_s: float) -> None:
    """One issue's whole life, each step read back: from foreman serve's start to the teardown."""
    await _start(h, p, timeout_s)
    n = await _open_issue(h, p, timeout_s)
    labelled_at = await _label_ready(h, p, n, timeout_s)
    lease_id = await _allocated(h, p, n, timeout_s)
    journal = await _bootstrapped(h, p, lease_id, timeout_s)
    await _evidence(h, p, n, lease_id, journal, labelled_at, timeout_s)
    await _agents(h, p, n, lease_id, journal, timeout_s)


async def _start(h: LoopHarness, p: Printer, timeout_s: float) -> None:
    """The emulator as seeded, foreman serve started and reaching it, and the repository's webhook."""
    repo = h.emulator.repo(OWNER, REPO)
    main_sha = h.git("--git-dir", str(repo.path), "rev-parse", repo.default_branch, cwd=h.root).strip()
    p.step("gitea", f"emulator on {h.gitea_url}: {OWNER}/{REPO} (bare repo {repo.path.relative_to(h.root)}, "
                    f"{repo.default_branch} at {main_sha[:12]}); users {MAINTAINER} (admin), {CONTROLLER}, "
                    f"{AUTHOR}, {REVIEWER}, {MERGER}, {BOT} (bot, admin); labels {', '.join(status_labels())}")

    await h.start_serve(timeout_s)
    assert h.serve is not None
    p.step("serve", f"foreman serve (pid {h.serve.pid}) listening on {h.webhook_url}; /readyz ready, Gitea reached "
                    f"as {BOT}")
    p.step("config", "allocation by the defaults: a ready issue goes to the next idle roster author (least live "
                     "leases, then longest idle; one lease each), proven before the lease and bootstrapped with it")
    hook = await h.register_hook(("issues", "pull_request"))
    p.step("webhook", f"{MAINTAINER} registered hook #{hook['id']} -> {h.webhook_url} (JSON, signed with the "
                      "shared secret, issue and pull request events)")


async def _open_issue(h: LoopHarness, p: Printer, timeout_s: float) -> int:
    """The maintainer opens the issue; its webhook is stored and handled."""
    issue = await h.api(MAINTAINER, "POST", "/issues", {"title": ISSUE_TITLE, "body": ISSUE_BODY})
    n = int(issue["number"])

    async def opened() -> StoredDelivery | None:
        async with h.foreman_db() as db:
            found = await DeliveryStore(db).with_action("issues", "opened")
        return found[0] if found and found[0].status == "done" else None

    await until("issue", opened, timeout_s, "the `opened` webhook never reached foreman (or never settled)")
    p.step("issue", f"{MAINTAINER} opened #{n} \"{ISSUE_TITLE}\"; its signed webhook was stored and handled")
    return n


async def _label_ready(h: LoopHarness, p: Printer, n: int, timeout_s: float) -> float:
    """The maintainer labels it status:ready and foreman takes it as a candidate; when it was labelled."""
    labelled_at = time.monotonic()
    await h.api(MAINTAINER, "POST", f"/issues/{n}/labels", {"labels": ["status:ready"]})

    async def label_delivered() -> Any:
        await h.emulator.drain_webhooks()
        return next((d for d in h.emulator.deliveries if d.event_type == "issue_label" and d.status), None)

    delivery = await until("label", label_delivered, timeout_s, "the label webhook was never sent")
    if delivery.status != 202:
        raise StepFailed("label", f"foreman answered the label webhook {delivery.status}: {delivery.response_body!r}")
    p.step("label", f"{MAINTAINER} labelled #{n} status:ready; webhook issue_label/label_updated "
                    f"(delivery {delivery.delivery_id[:8]}, X-Gitea-Signature) answered 202")

    async def candidate() -> dict[str, Any] | None:
        async with h.foreman_db() as db:
            events = await IssueStore(db).issue_events(FULL_NAME, n)
        return next((event for event in events if event["made_candidate"]), None)

    await until("candidate", candidate, timeout_s, f"#{n} never became a candidate")
    p.step("candidate", f"foreman recorded the label change: #{n} is a candidate (open, status:ready)")
    return labelled_at


async def _allocated(h: LoopHarness, p: Printer, n: int, timeout_s: float) -> str:
    """The lease foreman gave the author, with its labels and assignee read back from Gitea; its id."""
    async def leased() -> Lease | None:
        async with h.foreman_db() as db:
            return await LeaseStore(db).live_for_issue(FULL_NAME, n)

    lease = await until("allocate", leased, timeout_s, f"no lease on #{n} (is auto-allocation on?)")
    if lease.owner != AUTHOR:
        raise StepFailed("allocate", f"#{n} was leased to {lease.owner}, not {AUTHOR}")
    lease_id = lease.lease_id
    for effect in ("labels", "assignee"):
        await verified(h, "allocate", f"{lease_id}:{effect}", timeout_s)
    seen = await h.api(MAINTAINER, "GET", f"/issues/{n}")
    labels = sorted(label["name"] for label in seen["labels"])
    assignees = [user["login"] for user in seen.get("assignees") or []]
    if labels != ["status:in-progress"] or assignees != [AUTHOR]:
        raise StepFailed("allocate", f"Gitea shows labels {labels} and assignees {assignees}")
    p.step("allocate", f"lease {lease_id} for {AUTHOR} until {to_db_time(lease.expires_at)}; Gitea now shows assignee "
                       f"{AUTHOR} and label status:in-progress (each read back by foreman and by this demo)")
    return lease_id


async def _bootstrapped(h: LoopHarness, p: Printer, lease_id: str, timeout_s: float) -> Transition:
    """The lease's server-side bootstrap: its branch and worktree, as git shows them, from a checkout cloned with
    the bot's token."""
    async def bootstrapped() -> Transition | None:
        async with h.foreman_db() as db:
            found = await JournalStore(db).first_for_lease(lease_id)
        if found is not None and found.outcome == "compensated":
            raise StepFailed("bootstrap", f"the bootstrap was compensated: {json.dumps(found.error)}")
        return found if found is not None and found.phase == "completed" else None

    journal = await until("bootstrap", bootstrapped, timeout_s, "the server-side bootstrap never completed")
    branch, worktree = journal.branch, Path(journal.worktree_path)
    listed = h.git("worktree", "list", "--porcelain")
    head = h.git("rev-parse", "--abbrev-ref", "HEAD", cwd=worktree).strip()
    if f"worktree {worktree}\n" not in listed + "\n" or f"branch refs/heads/{branch}" not in listed or head != branch:
        raise StepFailed("bootstrap", f"git does not show {worktree} on {branch} (HEAD {head})")
    sha = h.git("rev-parse", "HEAD", cwd=worktree).strip()
    origin = h.git("config", "--get", "remote.origin.url").strip()
    served = [r for r in h.emulator.requests if r.path.startswith(f"/{OWNER}/{REPO}.git/")]
    if origin != f"{h.gitea_url}/{OWNER}/{REPO}.git" or not served or {(r.login, r.status) for r in served} != {
            (BOT, 200)}:
        raise StepFailed("bootstrap", f"the control checkout's origin is {origin}; git requests as"
                         f" {sorted({(str(r.login), r.status) for r in served})}, not only {BOT}'s, answered 200")
    p.step("bootstrap", f"branch {branch} at {sha[:12]} and worktree {worktree.relative_to(h.root)} registered "
                        f"with git (checked: git worktree list, HEAD inside it); control checkout cloned over HTTP "
                        f"from {origin} (private repository) with {BOT}'s token ({len(served)} git requests, "
                        f"each as {BOT})")
    return journal


async def _evidence(h: LoopHarness, p: Printer, n: int, lease_id: str, journal: Transition, labelled_at: float,
                    timeout_s: float) -> None:
    """The bootstrap's evidence comment, posted once and read back, taken as the issue's current state."""
    key = f"{journal.key}:evidence"
    evidence = await verified_comment(h, "evidence", n, key, timeout_s)
    allocation = await verified_comment(h, "evidence", n, f"{lease_id}:evidence", timeout_s)
    state = parse_comment(evidence["body"]).current
    if state is None or state.who_is_next != "author" or not state.next_action or not state.next_prompt:
        raise StepFailed("evidence", "the evidence comment carries no Canonical Issue State for the author")
    async def evidence_is_current() -> bool | None:
        # The outbox marks the comment verified, then its completion hook records it in the issue state: wait.
        return True if await state_comment_id(h, n) == evidence["id"] else None

    await until("evidence", evidence_is_current, timeout_s,
                "foreman did not take the evidence comment as the issue's current state")
    p.step("evidence", f"comment #{evidence['id']} posted once and read back (after the allocation's "
                       f"#{allocation['id']}); it is #{n}'s Canonical Issue State: WHO_IS_NEXT {state.who_is_next}")
    p.step("", f"NEXT_ACTION: {state.next_action}")
    p.step("loop", f"label -> verified evidence comment in {time.monotonic() - labelled_at:.2f}s")
    p.block(f"evidence comment #{evidence['id']} on {OWNER}/{REPO}#{n} (as Gitea serves it)", evidence["body"])


async def _agents(h: LoopHarness, p: Printer, n: int, lease_id: str, journal: Transition, timeout_s: float) -> None:
    """The agents through foreman serve's /mcp: the author's steps, then the review, the merge and the teardown."""
    branch, worktree = journal.branch, Path(journal.worktree_path)
    with (h.root / "mcp.log").open("w", encoding="utf-8") as errlog:
        async with mcp_session(h, errlog) as session:
            tools = (await session.list_tools()).tools
            context = await call_tool(session, "mcp", "gitea_get_runtime_context")
            p.step("mcp", f"{AUTHOR} connected to foreman serve's /mcp (Streamable HTTP, its own token; "
                          f"{len(tools)} tools); it says: {context['exact_next_action']}")
            pr = await author_steps(h, p, session, n, lease_id, worktree, branch, timeout_s)
        final = await review_merge_teardown(h, p, n, pr, worktree, branch, timeout_s, errlog)
    timeline = await h.comments(n)
    lines = [f"#{c['id']:<4} {c['user']['login']:<12} {find_marker(c['body']) or '(no marker)'}" for c in timeline]
    p.block(f"{OWNER}/{REPO}#{n}: every comment, in Gitea's order", "\n".join(lines))
    p.block(f"final evidence comment #{final['id']}", final["body"])


async def run_demo(out: TextIO, *, keep: bool = False, timeout_s: float = 30.0, verbose: bool = False) -> int:
    """Run the demo; prints every step to ``out`` as a short timeline (``verbose``: each step in full and the
    evidence comments with their JSON). Returns the exit status."""
    if shutil.which("git") is None:
        out.write("foreman demo: git is not installed (the bootstrap creates real git worktrees)\n")
        return EXIT_USAGE
    root = scratch_root("foreman-demo-")
    p = Printer(out, verbose=verbose)
    out.write(f"foreman demo: one issue's whole life against the bundled Gitea emulator, in {root}\n")
    out.flush()
    failed: StepFailed | None = None
    tail = ""
    try:
        async with open_harness(root, life=True) as h:
            try:
                await _loop(h, p, timeout_s)
            except StepFailed as exc:
                failed, tail = exc, h.serve_log_tail()
            except Exception as exc:  # a bug or an environment problem: name it, keep the evidence
                failed, tail = StepFailed("demo", f"{type(exc).__name__}: {exc}"), h.serve_log_tail()
    except StepFailed as exc:
        failed = exc
    if failed is not None:
        out.write(f"\nFAILED at step {failed.step!r}: {failed.message}\n")
        if tail:
            out.write(f"last lines of foreman serve's log ({root / 'serve.log'}):\n{tail}\n")
        out.write(f"the demo's files are kept in {root}\n")
        out.flush()
        return EXIT_FAILED
    if not verbose:
        out.write("(foreman demo --verbose: each step in full, and the evidence comments with their JSON)\n")
    out.write(f"\nforeman demo: every step verified in {time.monotonic() - p.started:.1f}s\n")
    if keep:
        out.write(f"files kept in {root} (foreman.toml, foreman.db, serve.log, checkouts/)\n")
    else:
        shutil.rmtree(root, ignore_errors=True)
    out.flush()
    return EXIT_OK


def main(*, keep: bool = False, timeout_s: float = 30.0, verbose: bool = False) -> int:
    """``foreman demo``."""
    return asyncio.run(run_demo(sys.stdout, keep=keep, timeout_s=timeout_s, verbose=verbose))
