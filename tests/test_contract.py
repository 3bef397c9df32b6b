"""Contract: the emulator's routes are swagger v1.26.3 operations, and the real client's traffic fits them.

Where Gitea's real behaviour (shared/gitea/FACTS.md) and the swagger text disagree, FACTS wins. The
conflicts met here, each allowed explicitly below:
- 401 (bad or missing token) is declared by no operation; ``securityDefinitions`` covers every route.
- POST/PUT ``.../issues/{index}/labels`` answer 400 for a mix of ids and names; swagger declares no 400,
  and types ``IssueLabelsOption.labels`` items as ``{}`` (anything).
- PATCH ``.../issues/{index}`` answers 409 for a stale ``content_version``; swagger declares 412, not 409.
- POST ``.../hooks`` needs repo admin (403) and validates its config (422); swagger declares 201/404 only.
- POST ``.../labels`` needs write access (403); swagger does not declare it.
- Error responses (403/404/422) are documented as headers ``message``/``url``; Gitea sends a JSON body.
- The ``labels`` filter of GET ``.../issues`` is documented as "any of"; Gitea applies AND (not checkable here).
- Swagger's definitions list no ``required`` keys and no nullability. Go always writes every field of
  these structs, so responses are checked strictly: every declared property present (except the
  ``omitempty`` ones in OMITEMPTY), only pointer/slice fields (NULLABLE) may be null, and no unknown keys
  (except ``User.username``, added by ``User.MarshalJSON``).
"""

from __future__ import annotations

import copy
import inspect
import json
import re
from collections.abc import AsyncIterator, Callable
from datetime import UTC
from typing import Any

import pytest
from jsonschema import Draft4Validator, FormatChecker  # type: ignore[import-untyped]
from referencing import Registry
from referencing.jsonschema import DRAFT4

from bot.emulator import ROUTES, RecordedRequest, SentWebhook
from bot.gitea import GiteaClient, GiteaConflict, GiteaForbidden, GiteaInvalid, GiteaNotFound
from tests.conftest import SHARED
from tests.gitea_fixtures import (
    BOT,
    HOOK_SECRET,
    OWNER,
    REPO,
    TOKENS,
    LiveEmulator,
    WebhookSink,
    live_emulator,
    webhook_sink,
)

#: Every test here checks against Gitea's own spec or payloads in ../shared.
pytestmark = pytest.mark.needs_shared

SWAGGER_FILE = SHARED / "gitea" / "swagger.v1.json"
URN = "urn:gitea-swagger-v1.26.3"
_REPO = "/repos/{owner}/{repo}"

ANY_ROUTE_STATUSES = frozenset({"401"})
EXTRA_STATUSES: dict[tuple[str, str], frozenset[str]] = {
    ("POST", f"{_REPO}/issues/{{index}}/labels"): frozenset({"400"}),
    ("PUT", f"{_REPO}/issues/{{index}}/labels"): frozenset({"400"}),
    ("PATCH", f"{_REPO}/issues/{{index}}"): frozenset({"409"}),
    ("POST", f"{_REPO}/hooks"): frozenset({"403", "422"}),
    ("POST", f"{_REPO}/labels"): frozenset({"403"}),
}
#: Definitions the emulator renders; each is checked strictly (all properties present, no unknown keys).
STRICT = (
    "Branch",
    "ChangedFile",
    "Comment",
    "Hook",
    "InternalTracker",
    "Issue",
    "Label",
    "PayloadCommit",
    "PayloadCommitVerification",
    "PayloadUser",
    "Permission",
    "PRBranchInfo",
    "PullRequest",
    "PullRequestMeta",
    "PullReview",
    "PullReviewComment",
    "RepoCollaboratorPermission",
    "Repository",
    "RepositoryMeta",
    "ServerVersion",
    "User",
)
#: Go pointer and slice fields that the emulator (like Gitea) writes as null.
NULLABLE: dict[str, frozenset[str]] = {
    "Issue": frozenset({"milestone", "assignee", "assignees", "closed_at", "due_date", "pull_request"}),
    "PullRequestMeta": frozenset({"merged_at"}),
    "PullReview": frozenset({"team"}),  # ReviewerTeam *Team: null for a user's review
    "PullReviewComment": frozenset({"resolver"}),  # Resolver *User: null until someone resolves it
    "PayloadCommit": frozenset({"added", "removed", "modified"}),
    "PayloadCommitVerification": frozenset({"signer"}),
    "PullRequest": frozenset(
        {
            "milestone",
            "assignee",
            "assignees",
            "requested_reviewers",
            "requested_reviewers_teams",
            "merged_at",
            "merge_commit_sha",
            "merged_by",
            "due_date",
            "closed_at",
        }
    ),
}
#: ``omitempty`` pointer fields of ``structs.Repository`` that are absent when nil.
OMITEMPTY: dict[str, frozenset[str]] = {
    "Repository": frozenset({"parent", "repo_transfer", "external_tracker", "external_wiki"}),
    # modules/structs/pull.go ``ChangedFile`` (1.22 to 1.26): ``previous_filename,omitempty`` and the URLs.
    "ChangedFile": frozenset({"previous_filename", "html_url", "contents_url", "raw_url"}),
    # modules/structs/pull.go (1.23+): ``review_comments,omitempty`` and the diff-stat pointers.
    "PullRequest": frozenset({"review_comments", "additions", "deletions", "changed_files"}),
}
COMPAT_KEYS: dict[str, dict[str, Any]] = {"User": {"username": {"type": "string"}}}
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$")


# ---------------------------------------------------------------------- the swagger document


@pytest.fixture(scope="module")
def swagger() -> dict[str, Any]:
    """The v1.26.3 swagger; a missing file fails the test (it must never be skipped)."""
    assert SWAGGER_FILE.is_file(), f"swagger spec missing at {SWAGGER_FILE}; set FOREMAN_SHARED"
    doc: dict[str, Any] = json.loads(SWAGGER_FILE.read_text())
    assert doc["swagger"] == "2.0" and doc["basePath"] == "/api/v1" and doc["info"]["version"] == "1.26.3"
    return doc


def _strict(doc: dict[str, Any]) -> dict[str, Any]:
    strict = copy.deepcopy(doc)
    for name in STRICT:
        definition = strict["definitions"][name]
        props: dict[str, Any] = definition["properties"]
        for key in NULLABLE.get(name, ()):
            props[key] = {"anyOf": [{"type": "null"}, props[key]]}
        definition["required"] = sorted(set(props) - OMITEMPTY.get(name, frozenset()))
        props.update(COMPAT_KEYS.get(name, {}))
        definition["additionalProperties"] = False
    return strict


class Schemas:
    """Validators over the whole (strict) swagger document, resolving ``#/definitions`` and ``#/responses``."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.registry: Registry[Any] = Registry().with_resource(URN, DRAFT4.create_resource(_strict(doc)))
        self.formats = FormatChecker(formats=())
        self.formats.checks("date-time")(lambda value: not isinstance(value, str) or bool(_RFC3339.match(value)))
        self.formats.checks("email")(lambda value: not isinstance(value, str) or "@" in value)

    def errors(self, pointer: str, instance: Any) -> list[str]:
        """Validation errors of ``instance`` against the schema at JSON pointer ``pointer`` of the document."""
        validator = Draft4Validator({"$ref": f"{URN}#{pointer}"}, registry=self.registry, format_checker=self.formats)
        return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(instance)]

    def operation(self, method: str, path: str) -> dict[str, Any]:
        """The swagger operation object."""
        op: dict[str, Any] = self.doc["paths"][path][method.lower()]
        return op

    def parameters(self, method: str, path: str) -> list[dict[str, Any]]:
        """Path-level and operation parameters, ``$ref``s resolved."""
        raw = [*self.doc["paths"][path].get("parameters", []), *self.operation(method, path).get("parameters", [])]
        return [self.doc["parameters"][p["$ref"].rsplit("/", 1)[1]] if "$ref" in p else p for p in raw]

    def response_pointer(self, method: str, path: str, status: str) -> str | None:
        """JSON pointer of the schema declared for ``status``, or None when it declares no body."""
        response = self.operation(method, path)["responses"][status]
        pointer = f"/paths/{_escape(path)}/{method.lower()}/responses/{status}"
        if "$ref" in response:
            pointer = response["$ref"].removeprefix("#")
            response = self.doc["responses"][pointer.rsplit("/", 1)[1]]
        return f"{pointer}/schema" if "schema" in response else None


def _escape(path: str) -> str:
    return path.replace("~", "~0").replace("/", "~1")


@pytest.fixture(scope="module")
def schemas(swagger: dict[str, Any]) -> Schemas:
    return Schemas(swagger)


# ---------------------------------------------------------------------- (a) the route table


def test_every_emulator_route_is_a_swagger_operation(swagger: dict[str, Any], schemas: Schemas) -> None:
    """Each (method, path template) of the emulator's route table exists in the swagger ``paths``."""
    missing = [(r.method, r.path) for r in ROUTES if r.method.lower() not in swagger["paths"].get(r.path, {})]
    assert missing == []
    for route in ROUTES:
        declared = {p["name"] for p in schemas.parameters(route.method, route.path) if p["in"] == "path"}
        assert declared == set(re.findall(r"\{(\w+)\}", route.path)), route.path


# ---------------------------------------------------------------------- (b) live traffic through the client


class CallLog:
    """Wraps a GiteaClient and notes which public methods were called."""

    def __init__(self, client: GiteaClient, used: set[str]) -> None:
        self._client = client
        self._used = used

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if callable(attr) and not name.startswith("_"):
            self._used.add(name)
        return attr


def _public_methods() -> set[str]:
    return {
        name
        for name, member in inspect.getmembers(GiteaClient)
        if not name.startswith("_") and (inspect.iscoroutinefunction(member) or inspect.isasyncgenfunction(member))
    }


async def _drive_every_route(live: LiveEmulator, sink: WebhookSink, used: set[str]) -> dict[str, Any]:
    """Call every client method (success and typical failures) and return what later checks compare."""
    emu = live.emulator
    bot, bob = CallLog(live.client(), used), CallLog(live.client("bob"), used)
    seen: dict[str, Any] = {}
    assert await bot.get_version() == "1.26.3"
    seen["me"] = (await bot.get_own_user()).login
    await bot.get_repo()
    emu.create_branch(OWNER, REPO, "issue/1-x", files={"x.txt": "x"})
    await bot.get_branch("issue/1-x")
    with pytest.raises(GiteaNotFound):
        await bot.get_branch("missing")
    assert await bot.get_user_permission("alice") == "write"
    with pytest.raises(GiteaForbidden):
        await bob.get_user_permission("alice")
    await bot.create_hook(url=sink.url, secret=HOOK_SECRET, events=["issues", "pull_request"])
    with pytest.raises(GiteaForbidden):
        await bob.create_hook(url=sink.url, secret="x")

    label = await bot.create_label("needs-info", color="#00aabb", description="waiting")
    labels = await bot.list_repo_labels(page_size=2)
    by_name = {x.name: x for x in labels}
    first = await bot.create_issue("first <issue>", body="body & more", labels=[by_name["bug"].id])
    await bot.create_issue("second", assignees=["alice"])
    emu.create_issue(OWNER, REPO, title="a pull request", author="alice", pull=True, notify=True)
    await bot.get_issue(first.number)
    with pytest.raises(GiteaNotFound):
        await bot.get_issue(999)
    await bot.edit_issue(first.number, title="first, renamed", body="new body", state="closed")
    await bot.edit_issue(first.number, state="open", assignees=["alice"])
    await bot.set_assignees(first.number, ["alice"])
    with pytest.raises(GiteaConflict):
        await bot.edit_issue(first.number, body="stale", content_version=0)
    assert len([i async for i in bot.iter_issues(labels=["bug"], limit=1)]) == 1
    await bot.list_issues(type_=None, limit=1)

    seen["added"] = [x.name for x in await bot.add_labels(first.number, ["feature", "status/ready"])]
    seen["replaced"] = [x.name for x in await bot.replace_labels(first.number, [by_name["bug"].id, label.id])]
    await bot.remove_label(first.number, label.id)
    with pytest.raises(GiteaInvalid):
        await bot.remove_label(first.number, 424242)
    await bot.list_issue_labels(first.number)
    await bot.clear_labels(first.number)

    comment = await bot.create_comment(first.number, "hello <world>")
    await bot.create_comment(3, "on the PR")
    await bot.get_comment(comment.id)
    with pytest.raises(GiteaNotFound):
        await bot.get_comment(comment.id + 1000)
    timeline_id = emu.issue(OWNER, REPO, first.number).timeline[0].id
    with pytest.raises(GiteaNotFound):
        await bot.get_comment(timeline_id)
    await bot.edit_comment(comment.id, "hello again")
    with pytest.raises(GiteaForbidden):
        await bob.edit_comment(comment.id, "not mine")
    await bot.list_issue_comments(first.number)
    # Catch-up's reads: Gitea's clock, and the listings with since (inclusive, whole seconds).
    clock = await bot.server_time()
    assert clock is not None and int(clock.timestamp()) == emu.now()
    # ``since`` exactly the issue's last update (the comment's creation bumped it; its edit came later): both
    # listings must include what was updated at that very second. (The clock read above may already be a second
    # later on a loaded machine, which made this flaky.)
    updated = (await bot.get_issue(first.number)).updated_at
    assert updated is not None
    since = updated.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert comment.id in [c.id async for c in bot.iter_repo_comments(since=since, limit=1)]
    assert first.number in [i.number async for i in bot.iter_issues(state="all", type_=None, since=since)]
    await bot.delete_comment(comment.id)
    await bot.delete_issue(2)

    # An organization's repository: org labels, teams with unit modes, team membership.
    emu.add_org("guild")
    emu.create_repo("guild", "tools")
    emu.set_permission("guild", "tools", BOT, "admin")
    emu.create_org_label("guild", "status:ready", exclusive=False)
    devs = emu.add_team(
        "guild", "devs", units={"repo.issues": "write", "repo.code": "read"}, members=["alice"], repos=["tools"]
    )
    next(t for t in emu.teams_of(emu.user("guild")) if t.access == "owner").members.append(emu.user(BOT))
    guild = CallLog(
        GiteaClient(
            live.session, base_url=live.base_url, token=TOKENS[BOT], owner="guild", repo="tools", backoff_base_s=0.005
        ),
        used,
    )
    assert [x.name for x in await guild.list_org_labels("guild")] == ["status:ready"]
    with pytest.raises(GiteaNotFound):
        await guild.list_org_labels(OWNER)
    assert [r.full_name for r in await guild.list_org_repos("guild")] == ["guild/tools"]
    teams = await guild.list_repo_teams()
    assert {(t.name, t.permission, t.units_map.get("repo.issues")) for t in teams} == {
        ("devs", "read", "write"),
        ("Owners", "owner", "owner"),
    }
    assert await guild.is_team_member(devs.id, "alice") is True
    assert await guild.is_team_member(devs.id, "bob") is False

    # Pull requests, in the org's repository (it has no hooks: the payload checks above stay about issues).
    emu.create_branch("guild", "tools", "feat", files={"f.txt": "f\n"})
    pr = await guild.create_pull("feat", title="feat", base="main", body="a change")
    with pytest.raises(GiteaConflict):
        await guild.create_pull("feat", title="again", base="main")
    assert (await guild.get_pull(pr.number)).head_sha == pr.head_sha
    emu.create_branch("guild", "tools", "main", files={"g.txt": "g\n"})  # the base moves on: the PR is behind
    await guild.update_pull(pr.number, style="merge")
    pr = await guild.get_pull(pr.number)
    # The merge's checks: the base branch's protection rule and the head's combined status.
    emu.protect_branch("guild", "tools", "release/*", required_approvals=2, enable_status_check=True,
                       status_check_contexts=["ci/*"])  # not the PR's base: its merge below is not held
    [rule] = await guild.list_branch_protections()
    assert (rule.rule_name, rule.required_approvals, rule.status_check_contexts) == ("release/*", 2, ("ci/*",))
    emu.set_commit_status("guild", "tools", pr.head_sha, context="ci/build", state="success",
                          target_url="https://ci.example/1")
    combined = await guild.combined_status(pr.head_sha)
    assert (combined.state, [(s.context, s.state, s.target_url) for s in combined.statuses]) == (
        "success", [("ci/build", "success", "https://ci.example/1")])
    assert [p.number for p in await guild.list_pulls(limit=1)] == [pr.number]
    reviewer = CallLog(
        GiteaClient(
            live.session,
            base_url=live.base_url,
            token=TOKENS["alice"],
            owner="guild",
            repo="tools",
            backoff_base_s=0.005,
        ),
        used,
    )
    with pytest.raises(GiteaInvalid):
        await reviewer.submit_review(pr.number, "REQUEST_CHANGES")
    await reviewer.submit_review(pr.number, "APPROVED", commit_id=pr.head_sha)
    assert [r.state for r in await guild.list_reviews(pr.number)] == ["APPROVED"]
    # What a reader of the PR reads: its changed files (paged), its diff (text, read only as far as asked) and the
    # code comments of a review (posted as Gitea's API lets a reviewer: a COMMENT review with a line comment).
    files = await guild.list_pull_files(pr.number, page=1, limit=1)
    assert (files.total, [(f.filename, f.status, f.additions) for f in files.files]) == (1, [("f.txt", "added", 1)])
    diff = await guild.pull_diff(pr.number, max_bytes=1 << 20)
    assert diff.complete and diff.text.startswith("diff --git a/f.txt b/f.txt") and "+f" in diff.text
    short = await guild.pull_diff(pr.number, max_bytes=10)
    assert (short.complete, short.text) == (False, diff.text[:10])
    with pytest.raises(GiteaNotFound):
        await guild.pull_diff(999, max_bytes=10)
    async with live.session.post(
        f"{live.base_url}/api/v1/repos/guild/tools/pulls/{pr.number}/reviews",
        json={"event": "COMMENT", "body": "one note", "commit_id": pr.head_sha,
              "comments": [{"path": "f.txt", "body": "why f?", "new_position": 1}]},
        headers={"Authorization": f"token {TOKENS['alice']}"},
    ) as answer:
        assert answer.status == 200, await answer.text()
        noted = await answer.json()
    [note] = await guild.list_review_comments(pr.number, noted["id"])
    assert (note.path, note.position, note.original_position, note.body, note.pull_request_review_id) == (
        "f.txt", 1, 0, "why f?", noted["id"])
    with pytest.raises(GiteaNotFound):
        await guild.list_review_comments(pr.number, 99999)
    assert await guild.is_merged(pr.number) is False
    with pytest.raises(GiteaConflict):
        await guild.merge_pull(pr.number, head_commit_id="0" * 40)
    await guild.merge_pull(pr.number, head_commit_id=pr.head_sha)
    assert await guild.is_merged(pr.number) is True
    with pytest.raises(GiteaInvalid):
        await guild.merge_pull(pr.number)
    await guild.delete_branch("feat")
    with pytest.raises(GiteaNotFound):
        await guild.delete_branch("feat")
    return seen


#: What driving every route left: the emulator, the webhooks it sent, what the driver saw, the routes it used.
Driven = tuple[LiveEmulator, list[SentWebhook], dict[str, Any], set[str]]


@pytest.fixture
async def driven() -> AsyncIterator[Driven]:
    async with live_emulator() as live, webhook_sink() as sink:
        used: set[str] = set()
        seen = await _drive_every_route(live, sink, used)
        deliveries = await live.emulator.drain_webhooks()
        assert len(sink.received) == len(deliveries) and all(d.ok for d in deliveries)
        assert [r.body for r in sink.received] != []
        yield live, deliveries, seen, used


#: Refusals Gitea answers with ``ctx.Status(...)`` and an empty body (audit #17, #19), not ``{message, url}``.
BARE_STATUS = {
    ("PATCH", "/repos/{owner}/{repo}/issues/{index}", 403),  # EditIssue
    ("PATCH", "/repos/{owner}/{repo}/issues/comments/{id}", 403),  # editIssueComment
    ("DELETE", "/repos/{owner}/{repo}/issues/comments/{id}", 403),  # deleteIssueComment
    ("DELETE", "/repos/{owner}/{repo}/issues/comments/{id}", 400),  # deleteIssueComment, no content support
    ("DELETE", "/repos/{owner}/{repo}/issues/{index}/labels/{id}", 403),  # DeleteIssueLabel
    ("DELETE", "/repos/{owner}/{repo}/issues/{index}/labels", 403),  # ClearIssueLabels
}


def _check_request(schemas: Schemas, record: RecordedRequest) -> list[str]:
    assert record.route is not None, f"unrouted request {record.method} {record.path}"
    problems: list[str] = []
    where = f"{record.method} {record.route} -> {record.status}"
    params = schemas.parameters(record.method, record.route)
    declared_query = {p["name"] for p in params if p["in"] == "query"}
    problems += [f"{where}: undeclared query parameter {k!r}" for k, _ in record.query if k not in declared_query]
    body_params = [p for p in params if p["in"] == "body"]
    if record.json is not None:
        assert body_params, f"{where}: a body was sent but none is declared"
        index = schemas.parameters(record.method, record.route).index(body_params[0])
        schema = body_params[0]["schema"]
        pointer = schema["$ref"].removeprefix("#") if "$ref" in schema else None
        assert pointer is not None, f"{where}: inline body schema at parameter {index}"
        problems += [f"{where}: request {e}" for e in schemas.errors(pointer, record.json)]
    else:
        assert not any(p.get("required") for p in body_params), f"{where}: required body missing"
    status = str(record.status)
    responses = schemas.operation(record.method, record.route)["responses"]
    allowed = set(responses) | ANY_ROUTE_STATUSES | EXTRA_STATUSES.get((record.method, record.route), set())
    if status not in allowed:
        problems.append(f"{where}: status not declared (declared {sorted(responses)})")
    if status in responses:
        pointer = schemas.response_pointer(record.method, record.route, status)
        if pointer is not None:
            problems += [f"{where}: response {e}" for e in schemas.errors(pointer, record.response_json)]
    if record.status is not None and record.status >= 400:
        body = record.response_json
        if (record.method, record.route, record.status) in BARE_STATUS and body is None:
            return problems
        if not (isinstance(body, dict) and isinstance(body.get("message"), str) and isinstance(body.get("url"), str)):
            problems.append(f"{where}: error body is not Gitea's JSON {{message, url}}: {body!r}")
    return problems


async def test_client_traffic_fits_the_swagger(schemas: Schemas, driven: Driven) -> None:
    """Every request the client made: declared query params, body valid, status declared, response valid."""
    live, _, _, used = driven
    records = live.emulator.requests
    problems = [problem for record in records for problem in _check_request(schemas, record)]
    assert problems == []
    exercised = {(r.method, r.route) for r in records}
    assert exercised == {(r.method, r.path) for r in ROUTES}, "some route was never driven through the client"
    assert used >= _public_methods(), f"client methods never exercised: {_public_methods() - used}"
    statuses = {(r.method, r.route, r.status) for r in records}
    assert ("PATCH", f"{_REPO}/issues/{{index}}", 201) in statuses
    assert ("GET", f"{_REPO}/issues/comments/{{id}}", 204) in statuses


# ---------------------------------------------------------------------- webhook payload structure

ISSUE_PAYLOAD_KEYS = {"action", "number", "issue", "repository", "sender", "commit_id"}
PULL_PAYLOAD_KEYS = {
    "action",
    "number",
    "pull_request",
    "requested_reviewer",
    "repository",
    "sender",
    "commit_id",
    "review",
}
COMMENT_PAYLOAD_KEYS = {"action", "issue", "comment", "repository", "sender", "is_pull"}


def _payload_problems(schemas: Schemas, delivery: SentWebhook) -> list[str]:
    payload = delivery.payload
    where = f"{delivery.event_type}/{delivery.action}"
    problems: list[str] = []

    def check(definition: str, value: Any) -> None:
        problems.extend(f"{where}: {definition} {e}" for e in schemas.errors(f"/definitions/{definition}", value))

    check("Repository", payload["repository"])
    check("User", payload["sender"])
    if delivery.event == "issue_comment":
        expected = COMMENT_PAYLOAD_KEYS | ({"pull_request"} if payload["is_pull"] else set())
        expected |= {"changes"} if delivery.action == "edited" else set()
        check("Issue", payload["issue"])
        check("Comment", payload["comment"])
        if payload["is_pull"]:
            check("PullRequest", payload["pull_request"])
    elif delivery.event == "pull_request":
        expected = PULL_PAYLOAD_KEYS | ({"changes"} if delivery.action == "edited" else set())
        check("PullRequest", payload["pull_request"])
    else:
        expected = ISSUE_PAYLOAD_KEYS | ({"changes"} if delivery.action == "edited" else set())
        check("Issue", payload["issue"])
    if set(payload) != expected:
        problems.append(f"{where}: keys {sorted(payload)} != {sorted(expected)}")
    return problems


async def test_webhook_payloads_have_gitea_shapes(schemas: Schemas, driven: Driven) -> None:
    """Payload keys per FACTS §3; nested issue/comment/repository/sender/pull_request fit the swagger."""
    _, deliveries, seen, _ = driven
    problems = [p for d in deliveries for p in _payload_problems(schemas, d)]
    assert problems == []
    by_kind: Callable[[str, str], list[dict[str, Any]]] = lambda kind, action: [  # noqa: E731
        d.payload for d in deliveries if d.event_type == kind and d.action == action
    ]
    label_events = by_kind("issue_label", "label_updated")
    # created-with-labels, add, replace, remove: every one carries the full label set after the change.
    assert [[x["name"] for x in p["issue"]["labels"]] for p in label_events] == [
        ["bug"],
        seen["added"],
        seen["replaced"],
        ["bug"],
    ]
    assert all("label" not in p and "changes" not in p for p in label_events)
    [cleared] = by_kind("issue_label", "label_cleared")
    # clearIssueLabels never reloads: the payload lists the labels from before the clear (the last remove left bug).
    assert [x["name"] for x in cleared["issue"]["labels"]] == ["bug"] and "label" not in cleared
    assert {p["sender"]["login"] for p in [*label_events, cleared]} == {seen["me"]} == {BOT}
    [assigned, assigned_again] = by_kind("issue_assign", "assigned")
    assert assigned["issue"]["assignees"][0]["login"] == assigned_again["issue"]["assignee"]["login"] == "alice"
    edits = by_kind("issues", "edited")
    assert [sorted(k for k in p["changes"] if p["changes"][k]) for p in edits] == [["title"], ["body"]]
    issue_actions = {d.action for d in deliveries if d.event_type == "issues"}
    assert issue_actions == {"opened", "edited", "closed", "reopened", "deleted"}
    assert all(p["commit_id"] == "" for p in by_kind("issues", "closed") + by_kind("issues", "opened"))
    comment_events = [d for d in deliveries if d.event == "issue_comment"]
    assert [(d.event_type, d.action) for d in comment_events] == [
        ("issue_comment", "created"),
        ("pull_request_comment", "created"),
        ("issue_comment", "edited"),
        ("issue_comment", "deleted"),
    ]
    assert comment_events[1].payload["is_pull"] is True and comment_events[0].payload["is_pull"] is False
    assert comment_events[2].payload["changes"]["body"]["from"] == "hello <world>"
    assert comment_events[3].payload["comment"]["body"] == "hello again"
    pull_opened = [d for d in deliveries if d.event_type == "pull_request"]
    assert [d.action for d in pull_opened] == ["opened"]
