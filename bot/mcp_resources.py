"""The issue and pull request an identity works on as MCP resources (``gitea://{owner}/{repo}/issues/{n}``,
``.../pulls/{n}``, ``.../pulls/{n}/diff``): listed for its live leases, read through the door (the read verbs, with
the same checks as the tools ``gitea_read_issue`` and ``gitea_read_pull_request``)."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import mcp.types as types
from mcp.server import ServerRequestContext
from mcp.shared.exceptions import MCPError

from bot.verbs.runtime import Caller, VerbResult, VerbRuntime

#: The MCP specification's error code for a resource that does not exist (or that this identity may not read).
RESOURCE_NOT_FOUND: Final = -32002
_URI: Final = re.compile(r"gitea://([A-Za-z0-9_][A-Za-z0-9_.-]{0,39})/([A-Za-z0-9_.-]{1,100})/(issues|pulls)/"
                         r"([1-9][0-9]{0,17})(/diff)?")
TEMPLATES: Final = (
    types.ResourceTemplate(
        name="issue", title="An issue", uri_template="gitea://{owner}/{repo}/issues/{n}", mime_type="application/json",
        description="gitea_read_issue's answer for issue n: title, body, labels, the first page of comments, its "
                    "Canonical Issue State, linked pull requests, dependencies"),
    types.ResourceTemplate(
        name="pull_request", title="A pull request", uri_template="gitea://{owner}/{repo}/pulls/{n}",
        mime_type="application/json",
        description="gitea_read_pull_request's answer for issue n's pull request (or pull request n): files, the "
                    "diff's first page, reviews and whether foreman counts each, review comments, commit status"),
    types.ResourceTemplate(
        name="pull_request_diff", title="A pull request's diff", uri_template="gitea://{owner}/{repo}/pulls/{n}/diff",
        mime_type="text/x-diff",
        description="the unified diff's first page (text/x-diff), then where it stands and how to read the rest "
                    "(application/json: pages, next_page; gitea_read_pull_request with page or file reads on)"),
)


@dataclass(frozen=True, slots=True)
class ResourceDoor:
    """One repository the identity reads in: its door and the identity as that repository's roster knows it."""

    runtime: VerbRuntime[Any]
    caller: Caller


ListResources = Callable[[ServerRequestContext[Any], types.PaginatedRequestParams | None],
                         Awaitable[types.ListResourcesResult]]
ListTemplates = Callable[[ServerRequestContext[Any], types.PaginatedRequestParams | None],
                         Awaitable[types.ListResourceTemplatesResult]]
ReadResource = Callable[[ServerRequestContext[Any], types.ReadResourceRequestParams],
                        Awaitable[types.ReadResourceResult]]


def resource_handlers(doors: Mapping[str, ResourceDoor]) -> dict[str, Any]:
    """The ``Server`` handlers (``on_list_resources``, ``on_list_resource_templates``, ``on_read_resource``) over
    ``doors`` (repository key → door)."""

    async def list_resources(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        out: list[types.Resource] = []
        for key, door in doors.items():
            now = door.runtime.clock()
            leases = [lease for lease in await door.runtime.leases.open_leases(door.runtime.repo)
                      if lease.owner == door.caller.login and lease.is_live(now)]
            for lease in sorted(leases, key=lambda lease: lease.issue_number):
                n = lease.issue_number
                base = f"gitea://{key}"
                out.append(types.Resource(name=f"issue-{n}", title=f"Issue #{n} ({lease.action} lease)",
                                          uri=f"{base}/issues/{n}", mime_type="application/json"))
                if lease.action in ("review", "merge"):
                    out.append(types.Resource(name=f"pull-{n}", title=f"The pull request of #{n}",
                                              uri=f"{base}/pulls/{n}", mime_type="application/json"))
                    out.append(types.Resource(name=f"diff-{n}", title=f"The diff of #{n}'s pull request",
                                              uri=f"{base}/pulls/{n}/diff", mime_type="text/x-diff"))
        return types.ListResourcesResult(resources=out)

    async def list_templates(
        ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(resource_templates=list(TEMPLATES))

    async def read_resource(
        ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        uri = str(params.uri)
        match = _URI.fullmatch(uri)
        if match is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"unknown resource {uri[:200]!a}: foreman serves "
                           "gitea://{owner}/{repo}/issues/{n}, .../pulls/{n} and .../pulls/{n}/diff")
        owner, repo, kind, number, diff = match.groups()
        repository = f"{owner}/{repo}"
        door = doors.get(repository.lower()) if len(doors) > 1 else next(iter(doors.values()))
        if door is None:  # several repositories, none of them this one: the door that would refuse it is none
            door = next(iter(doors.values()))
        verb = "read_issue" if kind == "issues" else "read_pull_request"
        result = await door.runtime.call(verb, door.caller, {"issue_number": int(number), "repository": repository})
        if not result.ok:
            raise _refusal(result)
        if diff is None:
            return types.ReadResourceResult(contents=[types.TextResourceContents(
                uri=uri, mime_type="application/json", text=json.dumps(result.doc, default=str))])
        part = dict(result.doc["diff"])
        text = str(part.pop("text"))
        return types.ReadResourceResult(contents=[
            types.TextResourceContents(uri=uri, mime_type="text/x-diff", text=text),
            types.TextResourceContents(uri=uri, mime_type="application/json", text=json.dumps(part, default=str)),
        ])

    return {"on_list_resources": list_resources, "on_list_resource_templates": list_templates,
            "on_read_resource": read_resource}


def _refusal(result: VerbResult) -> MCPError:
    """The door's refusal as the JSON-RPC error of ``resources/read``: its envelope in ``data``."""
    doc = result.doc
    code = RESOURCE_NOT_FOUND if doc.get("error") in ("not_found", "not_authorized") else types.INVALID_PARAMS
    return MCPError(code, str(doc.get("message") or doc.get("error")), data=doc)
