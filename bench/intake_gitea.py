"""The intake benchmark's Gitea: the emulator in a process of its own, serving ``demo/widgets`` with its issues, and
the ``issues`` deliveries a Gitea would send about them (the repository foreman serves).

    python -m bench.intake_gitea --port P --issues K --users N     # one JSON line, then serves until SIGTERM

The process seeds the demo world (``bot.demo.seed_demo``: the repository, its status labels, maintainer,
controller, author and bot accounts with their tokens), ``--users`` more write accounts ``author-2`` ...
(the MCP sessions' identities), and ``--issues`` open issues; then it prints one JSON line (its URL, the tokens)
and serves until SIGTERM. Every request foreman sends it is counted by method and route; ``GET /_bench/requests``
answers the counts so far (the benchmark reads them around each round: the worker's and the outbox's Gitea reads).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import re
import secrets
import signal
import sys
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from bot.core.vocabulary import label_for_state
from bot.demo import scratch_root, seed_demo
from bot.demo_harness import BOT, MAINTAINER, OWNER, REPO
from bot.emulator import Emulator, start_emulator

SERVED = f"{OWNER}/{REPO}"
#: Real Gitea payloads of the same shape (``../shared/gitea/payloads``), rewritten for the served repository.
PAYLOAD_FILES = ("issues-label_updated--go-playground.json", "issues-opened--go-playground.json")
#: The label sets the ``label_updated`` deliveries cycle through, one in eight ``status:ready``: that one runs an
#: auto-allocation (it reads the ready issues from Gitea; the first leases an issue to the roster's author and
#: bootstraps its worktree, the later ones find no idle author).
STATES = ("in-progress", "blocked", "review", "pr-open", "in-progress", "blocked", "review", "ready")
_NUMBERED_ROUTE = re.compile(r"/\d+")


def route_key(method: str, path: str) -> str:
    """A request's counting key: its method and path with every number as ``N`` (``GET /api/v1/repos/.../issues/N``)."""
    return f"{method} {_NUMBERED_ROUTE.sub('/N', path)}"


def _counting(counts: Counter[str]) -> Callable[..., Awaitable[web.StreamResponse]]:
    @web.middleware
    async def count(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                    ) -> web.StreamResponse:
        if not request.path.startswith("/_bench/"):
            counts[route_key(request.method, request.path)] += 1
        return await handler(request)

    return count


async def serve(port: int, issues: int, users: int, root: Path) -> int:
    emu = Emulator(root / "gitea")
    tokens = seed_demo(emu)
    for i in range(2, users + 1):
        login = f"author-{i}"
        tokens[login] = f"gitea-{login}-{secrets.token_hex(12)}"
        emu.add_user(login, token=tokens[login])
        emu.set_permission(OWNER, REPO, login, "write")
    numbers = [emu.create_issue(OWNER, REPO, title=f"Intake issue {i + 1}", author=MAINTAINER, body="bench").number
               for i in range(issues)]
    counts: Counter[str] = Counter()

    async def requests(_: web.Request) -> web.Response:
        return web.json_response(dict(counts))

    emu.app.middlewares.append(_counting(counts))
    emu.app.router.add_get("/_bench/requests", requests)
    runner, url = await start_emulator(emu, "127.0.0.1", port)
    try:
        print(json.dumps({"url": url, "tokens": tokens, "bot": BOT, "repository": SERVED, "issues": numbers}),
              flush=True)
        stopped = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stopped.set)
        await stopped.wait()
    finally:
        await runner.cleanup()
        await emu.aclose()
    return 0


# --- the deliveries ---------------------------------------------------------------------------------------------------
def served_template(template: dict[str, Any], gitea_url: str) -> dict[str, Any]:
    """A Gitea ``issues`` payload rewritten for ``demo/widgets`` at ``gitea_url``: its repository, owner, URLs."""
    doc = copy.deepcopy(template)
    repo = doc["repository"]
    old_full = str(repo["full_name"])
    repo.update(name=REPO, full_name=SERVED, html_url=f"{gitea_url}/{SERVED}", clone_url=f"{gitea_url}/{SERVED}.git",
                ssh_url=f"git@127.0.0.1:{SERVED}.git")
    for account in (repo.get("owner"), doc.get("sender")):
        if isinstance(account, dict):
            account["login"] = account["username"] = OWNER if account is repo.get("owner") else MAINTAINER
    issue = doc["issue"]
    issue["repository"] = {"id": repo.get("id", 1), "name": REPO, "owner": OWNER, "full_name": SERVED}
    text = json.dumps(doc)
    return dict(json.loads(text.replace(old_full, SERVED)))


#: The size of each delivery: the issue's own text fills the body up to it (the issue's "6.5 KB" deliveries).
BODY_BYTES = 6400


def issue_body(template: dict[str, Any], seq: int, number: int, run_tag: str) -> bytes:
    """One unique ``issues`` delivery about issue ``number``: ``label_updated`` templates get the next label set of
    ``STATES``, every body its own title and update time, the issue's text filling it to ``BODY_BYTES``; Gitea's
    2-space layout, no trailing newline."""
    doc = copy.deepcopy(template)
    doc["number"] = number
    issue = doc["issue"]
    base = str(issue.get("url", "")).rsplit("/issues/", 1)[0]
    issue.update(number=number, id=100_000 + number, url=f"{base}/issues/{number}",
                 html_url=str(issue.get("html_url", "")).rsplit("/", 1)[0] + f"/{number}",
                 title=f"Intake issue {number} ({run_tag} #{seq})",
                 updated_at=f"2026-01-01T00:{seq // 3600 % 60:02d}:{seq // 60 % 60:02d}+00:00")
    if doc.get("action") == "label_updated":
        label = label_for_state(STATES[seq % len(STATES)])
        issue["labels"] = [{"id": 10 + seq % len(STATES), "name": label, "color": "00aa00", "description": "",
                            "url": f"{base}/labels/{10 + seq % len(STATES)}"}]
    issue["body"] = ""
    short = len(json.dumps(doc, indent=2).encode())
    words = f"Issue {number} as the maintainer wrote it, seen in delivery {seq} of run {run_tag}. "
    issue["body"] = (words * (1 + BODY_BYTES // len(words)))[: max(0, BODY_BYTES - short)]
    return json.dumps(doc, indent=2).encode()


def load_issue_templates(folder: Path) -> list[dict[str, Any]] | None:
    """The real ``issues`` payloads in ``folder`` (None when one is missing: the built-in generator then)."""
    found = []
    for name in PAYLOAD_FILES:
        path = folder / name
        if not path.is_file():
            return None
        found.append(json.loads(path.read_bytes()))
    return found


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench.intake_gitea", description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--issues", type=int, default=50, help="open issues in demo/widgets")
    parser.add_argument("--users", type=int, default=1, help="write accounts author-1 ... author-N")
    parser.add_argument("--dir", type=Path, help="the emulator's files (default: a new folder on /dev/shm)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    root = args.dir if args.dir is not None else scratch_root("foreman-bench-gitea-")
    return asyncio.run(serve(args.port, args.issues, args.users, root))


if __name__ == "__main__":
    sys.exit(main())
