"""Git over smart HTTP for the emulator: ``git http-backend`` (CGI) behind Gitea's access rules."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from aiohttp import web

from bot.emulator import pullgit
from bot.emulator.model import PERM_LEVEL

if TYPE_CHECKING:
    from bot.emulator.core import Emulator

REALM: Final = 'Basic realm="Gitea"'
_SERVICES: Final = ("git-upload-pack", "git-receive-pack")


def _unauthorized() -> web.Response:
    return web.Response(status=401, text="Unauthorized\n", headers={"WWW-Authenticate": REALM})


async def serve_git(emu: Emulator, request: web.Request) -> web.StreamResponse:
    """``/{owner}/{repo}.git/(info/refs|git-upload-pack|git-receive-pack)``: access check, then http-backend.

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
    body = await request.read()
    env = {
        "GIT_PROJECT_ROOT": str(emu.root),
        "GIT_HTTP_EXPORT_ALL": "1",
        "PATH_INFO": f"/{repo.owner.login}/{repo.name}.git/{rest}",
        "QUERY_STRING": request.query_string,
        "REQUEST_METHOD": request.method,
        "CONTENT_TYPE": request.headers.get("Content-Type", ""),
        "CONTENT_LENGTH": str(len(body)),
        "REMOTE_USER": doer.login if doer else "",
        "REMOTE_ADDR": request.remote or "",
        "GIT_HTTP_MAX_REQUEST_BUFFER": "100M",
        "PATH": "/usr/bin:/bin",
    }
    if request.headers.get("Content-Encoding"):
        env["HTTP_CONTENT_ENCODING"] = request.headers["Content-Encoding"]
    if request.headers.get("Git-Protocol"):
        env["GIT_PROTOCOL"] = request.headers["Git-Protocol"]
    pushing = service == "git-receive-pack" and rest == "git-receive-pack" and doer is not None
    before = await asyncio.to_thread(pullgit.all_branches, repo.path) if pushing else {}
    proc = await asyncio.create_subprocess_exec(
        "git",
        "http-backend",
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(body)
    head, _, payload = out.partition(b"\r\n\r\n")
    if not _:
        head, _, payload = out.partition(b"\n\n")
    status = 200
    headers: dict[str, str] = {}
    for line in head.decode("latin-1").splitlines():
        key, _, value = line.partition(":")
        if key.lower() == "status":
            status = int(value.strip().split(" ", 1)[0])
        elif key:
            headers[key.strip()] = value.strip()
    if proc.returncode and status == 200 and not payload:
        return web.Response(status=500, text=err.decode("utf-8", "replace"))
    if pushing and doer is not None:
        # Gitea's post-receive hook (routers/private/hook_post_receive.go → services/repository/push.go): the
        # push, create/delete and pull-request synchronisation events of every ref the push changed.
        after = await asyncio.to_thread(pullgit.all_branches, repo.path)
        emu.on_push(repo, doer, before, after)
        emu._sender.kick()
    return web.Response(status=status, body=payload, headers=headers)


def add_git_routes(app: web.Application, emu: Emulator) -> None:
    """The smart-HTTP routes, beside ``/api/v1``."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return await serve_git(emu, request)

    for method in ("GET", "POST"):
        app.router.add_route(
            method, r"/{owner}/{repo:[^/]+\.git}/{rest:info/refs|git-upload-pack|git-receive-pack}", handle
        )
