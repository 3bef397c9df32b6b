"""Git over smart HTTP for the emulator as Gitea serves it (routers/web/repo/githttp.go): its access rules, then
``git upload-pack``/``receive-pack --stateless-rpc`` run directly (never ``git http-backend``)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import TYPE_CHECKING, Final

from aiohttp import web

from bot.emulator import pullgit
from bot.emulator.model import PERM_LEVEL

if TYPE_CHECKING:
    from bot.emulator.core import Emulator
    from bot.emulator.model import EmuRepo, EmuUser

REALM: Final = 'Basic realm="Gitea"'
_SERVICES: Final = ("git-upload-pack", "git-receive-pack")
_SAFE_GIT_PROTOCOL: Final = re.compile(r"[0-9a-zA-Z]+=[0-9a-zA-Z]+(:[0-9a-zA-Z]+=[0-9a-zA-Z]+)*")
#: ``setHeaderNoCache``: the headers of every ``info/refs`` answer.
_NO_CACHE: Final = {"Expires": "Fri, 01 Jan 1980 00:00:00 GMT", "Pragma": "no-cache",
                    "Cache-Control": "no-cache, max-age=0, must-revalidate"}


def _unauthorized() -> web.Response:
    return web.Response(status=401, text="Unauthorized\n", headers={"WWW-Authenticate": REALM})


async def serve_git(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """``/{owner}/{repo}.git/(info/refs|git-upload-pack|git-receive-pack)``: access check, then the git service.

    routers/web/repo/githttp.go ``httpBase`` (1.22.3 and 1.26.3): a pull (``info/refs?service=git-upload-pack``,
    ``git-upload-pack``) of a public repository needs no credentials; anything else needs a signed-in user
    (``Authorization: token X``/``Bearer X``, or Basic with the token as user or password), else **401** with
    ``WWW-Authenticate: Basic realm="Gitea"``; a user without the needed access gets **404** "Repository not
    found"; a push needs Write on the Code unit. A credential that does not verify is a 401 (the auth layer
    refuses it; the exact body of that path was not verified).
    """
    from bot.emulator.api import authenticate
    from bot.emulator.state import ApiError

    owner, name, rest = request.match_info["owner"], request.match_info["repo"], request.match_info["rest"]
    name = name.removesuffix(".git")
    service = request.query.get("service", "") if rest == "info/refs" else rest
    if service not in _SERVICES:
        return web.Response(status=404, text="Repository not found\n")
    is_pull = service == "git-upload-pack"
    try:
        doer = authenticate(emu, request.headers.get("Authorization"))
    except ApiError:
        return _unauthorized()
    repo = emu.find_repo(owner, name)
    if repo is None:
        return web.Response(status=404, text="Repository not found\n")
    if not (is_pull and not repo.private):
        if doer is None:
            return _unauthorized()
        needed = "read" if is_pull else "write"
        if PERM_LEVEL[emu.unit_perm(repo, doer, "repo.code")] < PERM_LEVEL[needed]:
            return web.Response(status=404, text="Repository not found\n")
    if rest == "info/refs":
        return await _advertise(repo.path, service, request)
    return await _service_rpc(emu, repo, doer, service, request)


def _protocol_env(request: web.Request) -> dict[str, str]:
    """Gitea passes ``Git-Protocol`` on only when it is ``key=value`` pairs (``safeGitProtocolHeader``)."""
    protocol = request.headers.get("Git-Protocol", "")
    return {"GIT_PROTOCOL": protocol} if protocol and _SAFE_GIT_PROTOCOL.fullmatch(protocol) else {}


def _packet(text: str) -> bytes:
    """One pkt-line: four hex digits of the length (itself included), then the text (``packetWrite``)."""
    data = text.encode()
    return f"{len(data) + 4:04x}".encode() + data


async def _git(repo_path: Path, args: list[str], request: web.Request, stdin: bytes | None) -> tuple[int, bytes, bytes]:
    proc = await asyncio.create_subprocess_exec(
        "git", *args, ".", cwd=repo_path, env={"PATH": "/usr/bin:/bin", "HOME": str(repo_path),
                                               **_protocol_env(request)},
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(stdin)
    return proc.returncode or 0, out, err


async def _advertise(repo_path: Path, service: str, request: web.Request) -> web.Response:
    """``GetInfoRefs`` (1.22.3 and 1.26.3): ``git <service> --stateless-rpc --advertise-refs .`` run by Gitea itself,
    its output after the ``# service=`` pkt-line and a flush, never cached; a failed command is a 500."""
    status, refs, err = await _git(repo_path, [service.removeprefix("git-"), "--stateless-rpc", "--advertise-refs"],
                                   request, None)
    if status:
        return web.Response(status=500, text=err.decode("utf-8", "replace"))
    return web.Response(status=200, body=_packet(f"# service={service}\n") + b"0000" + refs, headers={
        **_NO_CACHE, "Content-Type": f"application/x-{service}-advertisement"})


async def _service_rpc(emu: Emulator, repo: EmuRepo, doer: EmuUser | None, service: str,
                       request: web.Request) -> web.Response:
    """``serviceRPC`` (1.22.3 and 1.26.3): the request's Content-Type must be ``application/x-<service>-request``
    (else 400), a gzip body is unpacked (400 when it is not gzip: the emulator's middleware), and ``git <service>
    --stateless-rpc .`` answers with ``application/x-<service>-result``. A push then runs what Gitea's post-receive
    hook does."""
    if request.headers.get("Content-Type") != f"application/x-{service}-request":
        return web.Response(status=400)
    body = await request.read()  # a gzip body arrives unpacked (aiohttp; one that is not gzip: 400 before this)
    pushing = service == "git-receive-pack" and doer is not None
    before = await asyncio.to_thread(pullgit.all_branches, repo.path) if pushing else {}
    _status, out, _err = await _git(repo.path, [service.removeprefix("git-"), "--stateless-rpc"], request, body)
    if pushing and doer is not None:
        # Gitea's post-receive hook (routers/private/hook_post_receive.go → services/repository/push.go): the
        # push, create/delete and pull-request synchronisation events of every ref the push changed.
        after = await asyncio.to_thread(pullgit.all_branches, repo.path)
        emu.on_push(repo, doer, before, after)
        emu._sender.kick()
    # Gitea streams the command's output with the 200 already sent (a failure is only logged).
    return web.Response(status=200, body=out, headers={"Content-Type": f"application/x-{service}-result"})


def add_git_routes(app: web.Application, emu: Emulator) -> None:
    """The smart-HTTP routes, beside ``/api/v1``."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return await serve_git(emu, request)

    # routers/web/githttp.go: GET for info/refs, POST for the services (any other method: 405).
    app.router.add_route("GET", r"/{owner}/{repo:[^/]+\.git}/{rest:info/refs}", handle)
    app.router.add_route("POST", r"/{owner}/{repo:[^/]+\.git}/{rest:git-upload-pack|git-receive-pack}", handle)
