"""``/mcp`` in ``foreman serve``: bearer authentication before MCP, sessions bound to their principal, the endpoint's
bounds, and the same server as over stdio (the official SDK's Streamable HTTP client over real loopback HTTP)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from bot.mcp_server import offered_tools
from bot.verbs.runtime import caller_for
from tests.mcp_http_support import call, mcp_over_http
from tests.support import HANG_S, Started, make_settings

ROSTER = {"controller-bot": ["controller"], "author-1": ["author"], "rev-1": ["reviewer"]}
CONTROLLER = "tok-controller-http"
AUTHOR_SECRET = "tok-author-1-only-its-digest-is-configured"
REVIEWER_SECRET = "tok-rev-1-only-its-digest-is-configured"


def digest(token: str) -> str:
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()


def settings_for(tmp_path: Path, **mcp: Any) -> Any:
    return make_settings(tmp_path, roster=ROSTER, mcp={
        "tokens": {CONTROLLER: "controller-bot"},
        "token_digests": {"author-1": digest(AUTHOR_SECRET), "rev-1": [digest("old-rev"), digest(REVIEWER_SECRET)]},
        **mcp})


INITIALIZE: dict[str, Any] = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}}}
JSON_HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}


async def raw(url: str, *, method: str = "POST", body: Any = INITIALIZE, headers: dict[str, str] | None = None
              ) -> tuple[int, dict[str, str], Any]:
    async with aiohttp.ClientSession() as session, session.request(
        method, url, data=json.dumps(body).encode() if body is not None else None,
        headers={**JSON_HEADERS, **(headers or {})}) as resp:
        text = await resp.text()
        try:
            doc = json.loads(text)
        except ValueError:
            doc = text
        return resp.status, dict(resp.headers), doc


async def test_each_identity_is_served_its_own_tools_by_its_token_or_its_digest(start: Started, tmp_path: Path) -> None:
    """The controller by a plain token, the author and the reviewer by a token the config holds only as a digest
    (the reviewer's second digest); each is offered exactly what ``foreman mcp`` offers it over stdio."""
    settings = settings_for(tmp_path)
    _, client = await start(settings)
    url = str(client.make_url("/mcp"))
    for token, login in ((CONTROLLER, "controller-bot"), (AUTHOR_SECRET, "author-1"), (REVIEWER_SECRET, "rev-1")):
        async with mcp_over_http(url, token) as session:
            listed = [tool.name for tool in (await session.list_tools()).tools]
            assert listed == [tool.name for tool in offered_tools(caller_for(settings, login, "mcp"))], login
            context = await call(session, "gitea_get_runtime_context")
            assert context["identity"]["login"] == login, context


@pytest.mark.parametrize(("header", "reason"), [
    (None, "missing"), ("Basic dG9rOnRvaw==", "missing"), ("Bearer ", "missing"), ("Bearer tok-guess", "unknown"),
    ("Bearer " + digest(AUTHOR_SECRET), "unknown"),  # the digest itself is not the token
    ("Bearer frun_not-a-run", "unknown"), ("Bearer tok-caf\u00e9", "unknown"),
])
async def test_a_request_without_a_known_token_is_401_before_any_mcp(
    start: Started, tmp_path: Path, header: str | None, reason: str
) -> None:
    service, client = await start(settings_for(tmp_path))
    headers = {"Authorization": header} if header is not None else {}
    status, answer_headers, doc = await raw(str(client.make_url("/mcp")), headers=headers)
    assert status == 401, doc
    assert answer_headers["WWW-Authenticate"].startswith("Bearer")
    assert doc["error"] == "unauthorized" and doc["exact_next_action"], doc
    assert "Mcp-Session-Id" not in answer_headers
    assert service.metrics.mcp_auth_failures.labels(reason)._value.get() == 1
    assert service.mcp is not None and service.mcp.sessions() == 0


async def test_a_session_answers_only_the_principal_that_opened_it(start: Started, tmp_path: Path) -> None:
    """The author's session id presented with the reviewer's token (or none) is unknown to it: 404, and no call
    of the author's runs in the reviewer's session or the other way round."""
    _, client = await start(settings_for(tmp_path))
    url = str(client.make_url("/mcp"))
    status, headers, doc = await raw(url, headers={"Authorization": f"Bearer {AUTHOR_SECRET}"})
    assert status == 200, doc
    session_id = headers["mcp-session-id"]
    listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": {}}
    mine = {"Authorization": f"Bearer {AUTHOR_SECRET}", "Mcp-Session-Id": session_id,
            "MCP-Protocol-Version": "2025-06-18"}
    await raw(url, body={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=mine)
    status, _, doc = await raw(url, body=listing, headers=mine)
    assert status == 200 and doc["result"]["tools"], doc
    theirs = {**mine, "Authorization": f"Bearer {REVIEWER_SECRET}"}
    status, _, doc = await raw(url, body=listing, headers=theirs)
    assert status == 404, doc
    status, _, doc = await raw(url, method="DELETE", body=None, headers=theirs)
    assert status == 404, doc
    status, _, doc = await raw(url, body=listing, headers=mine)  # the owner's session is still there
    assert status == 200, doc


async def test_failed_authentications_throttle_the_address_and_are_counted(start: Started, tmp_path: Path) -> None:
    """Past ``auth_failures_per_minute`` a failure from the address is 429 with Retry-After, and only after a wait
    (a slowdown, not an answer at once); a right token from the same address is still served (agents on one host
    share it: one of them failing never locks the others out). Each refusal is counted."""
    import time

    service, client = await start(settings_for(tmp_path, auth_failures_per_minute=5))
    url = str(client.make_url("/mcp"))
    statuses = [(await raw(url, headers={"Authorization": f"Bearer guess-{n}"}))[0] for n in range(5)]
    started = time.monotonic()
    status, headers, doc = await raw(url, headers={"Authorization": "Bearer guess-6"})
    waited = time.monotonic() - started
    assert statuses == [401] * 5 and status == 429, (statuses, status)
    assert int(headers["Retry-After"]) >= 1 and doc["error"] == "too_many_failures", doc
    assert waited >= 0.9  # the tarpit's second (a lower bound: never a timing of how fast it is)
    status, _, doc = await raw(url, headers={"Authorization": f"Bearer {AUTHOR_SECRET}"})
    assert status == 200, doc
    assert service.metrics.mcp_auth_failures.labels("unknown")._value.get() == 5
    assert service.metrics.mcp_auth_failures.labels("throttled")._value.get() == 1


def test_the_throttle_counts_a_host_as_one_client() -> None:
    """Every loopback address is one client (a process on the host may bind any of 127/8), an IPv6 address counts
    by its /64; other addresses by themselves."""
    from bot.mcp_http import throttle_key

    assert throttle_key("127.0.0.1") == throttle_key("127.8.9.10") == throttle_key("::1") == "loopback"
    assert throttle_key("2001:db8::1") == throttle_key("2001:db8::ffff") == "2001:db8::/64"
    assert throttle_key("2001:db8:0:1::1") != throttle_key("2001:db8::1")
    assert throttle_key("10.0.0.1") != throttle_key("10.0.0.2")
    assert throttle_key("unknown") == "unknown"


async def test_the_throttle_forgets_failures_after_the_window() -> None:
    from bot.mcp_http import AuthThrottle

    throttle = AuthThrottle(3, window_s=60.0, addresses=2)
    for moment in (0.0, 1.0, 2.0):
        assert throttle.retry_after("a", moment) is None
        throttle.failed("a", moment)
    assert throttle.retry_after("a", 30.0) == pytest.approx(30.0)
    assert throttle.retry_after("a", 60.5) is None  # the first failure left the window
    throttle.failed("b", 61.0)
    throttle.failed("c", 61.0)  # a third address: the least recently failed ("a") is forgotten
    assert throttle.retry_after("a", 61.0) is None and "a" not in throttle._failures


@pytest.mark.parametrize(("origin", "status"), [
    ("http://evil.example", 403), ("http://127.0.0.1:9", 403), ("https://agents.example.com", 200), (None, 200)])
async def test_a_browser_origin_must_be_allowed(start: Started, tmp_path: Path, origin: str | None,
                                                status: int) -> None:
    _, client = await start(settings_for(tmp_path, allowed_origins=["https://agents.example.com"]))
    headers = {"Authorization": f"Bearer {CONTROLLER}", **({"Origin": origin} if origin else {})}
    answer, _, doc = await raw(str(client.make_url("/mcp")), headers=headers)
    assert answer == status, doc
    if status == 403:
        assert doc["error"] == "forbidden_origin" and "allowed_origins" in doc["exact_next_action"]


async def test_the_endpoints_bounds_are_json_refusals(start: Started, tmp_path: Path) -> None:
    """A body over ``max_body_bytes`` is 413 (declared or streamed), a GET is 405 (no event stream is offered),
    and an unsupported protocol version is refused by the SDK, never answered as if it were supported."""
    _, client = await start(settings_for(tmp_path, max_body_bytes=8192))
    url = str(client.make_url("/mcp"))
    auth = {"Authorization": f"Bearer {CONTROLLER}"}
    big = {**INITIALIZE, "params": {**INITIALIZE["params"], "pad": "x" * 10_000}}
    status, _, doc = await raw(url, body=big, headers=auth)
    assert status == 413 and doc["error"] == "payload_too_large", doc

    async def chunks() -> Any:
        for _ in range(4):
            yield b" " * 4096
    async with aiohttp.ClientSession() as session, session.post(url, data=chunks(),
                                                                headers={**JSON_HEADERS, **auth}) as resp:
        assert resp.status == 413
    status, headers, doc = await raw(url, method="GET", body=None, headers=auth)
    assert status == 405 and "POST" in headers["Allow"], doc
    status, _, doc = await raw(url, body={"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
                               headers={**auth, "MCP-Protocol-Version": "1999-01-01"})
    assert status == 400, doc


async def test_a_call_over_http_runs_through_the_door_as_its_identity(start: Started, tmp_path: Path) -> None:
    """The reviewer asking to merge is refused by the door (not_authorized), the author's unknown tool is
    invalid_input naming what it may call: the same envelopes as over stdio."""
    _, client = await start(settings_for(tmp_path))
    url = str(client.make_url("/mcp"))
    async with mcp_over_http(url, REVIEWER_SECRET) as session:
        doc = await call(session, "gitea_merge_pull_request", issue_number=1, pr_number=2, expected_head_sha="a" * 40)
        assert doc["is_error"] and doc["error"] == "not_authorized", doc
    async with mcp_over_http(url, AUTHOR_SECRET) as session:
        doc = await call(session, "release_lease", issue_number=1)
        assert doc["is_error"] and doc["error"] == "invalid_input" and "unknown tool" in doc["message"], doc


def test_token_digests_must_be_sha256(tmp_path: Path) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="sha256"):
        make_settings(tmp_path, mcp={"token_digests": {"author-1": "md5:abc"}})
    with pytest.raises(ValidationError, match="not an origin"):
        make_settings(tmp_path, mcp={"allowed_origins": ["agents.example.com"]})



async def test_the_digest_foreman_token_digest_prints_is_what_authenticates(start: Started, tmp_path: Path) -> None:
    """``foreman token-digest`` (no configuration read) prints the TOML line; a config holding only that line
    serves the token's owner; an empty input is refused with the command to run."""
    import subprocess
    import sys
    import tomllib

    from tests.conftest import REPO_ROOT

    token = "tok-printed-by-the-operator-0123456789"
    done = subprocess.run([sys.executable, "-m", "bot", "token-digest", "--login", "author-1"], input=token + "\n",
                          capture_output=True, text=True, timeout=HANG_S, check=True, cwd=REPO_ROOT)
    line = tomllib.loads(done.stdout)
    _, client = await start(make_settings(tmp_path, roster=ROSTER, mcp={"token_digests": line}))
    async with mcp_over_http(str(client.make_url("/mcp")), token) as session:
        assert (await call(session, "gitea_get_runtime_context"))["identity"]["login"] == "author-1"
    refused = subprocess.run([sys.executable, "-m", "bot", "token-digest"], input="", capture_output=True, text=True,
                             timeout=HANG_S, check=False, cwd=REPO_ROOT)
    assert refused.returncode == 2 and "token-digest" in json.loads(refused.stderr)["exact_next_action"]


async def test_open_sessions_are_counted_when_metrics_are_read_not_per_request(
    start: Started, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``foreman_mcp_sessions`` is the open sessions at the moment /metrics is read; answering a request never walks
    every principal's endpoint to count them (with 1,000 identities that walk was 9% of serve's loop)."""
    from bot.mcp_http import _Endpoint

    walked = 0
    counted = _Endpoint.sessions

    def counting(self: _Endpoint) -> int:
        nonlocal walked
        walked += 1
        return counted(self)

    monkeypatch.setattr(_Endpoint, "sessions", counting)
    _, client = await start(settings_for(tmp_path))
    url = str(client.make_url("/mcp"))

    async def gauge() -> float:
        async with aiohttp.ClientSession() as http, http.get(str(client.make_url("/metrics"))) as resp:
            text = await resp.text()
        return float(next(line.split()[1] for line in text.splitlines() if line.startswith("foreman_mcp_sessions ")))

    async with mcp_over_http(url, CONTROLLER) as first, mcp_over_http(url, AUTHOR_SECRET) as second:
        walked = 0  # opening a session counts them once ([mcp] max_sessions_total); a request in one never does
        for session in (first, second, first):
            await session.list_tools()
        assert walked == 0
        assert await gauge() == 2.0 and walked == 2  # one walk of the two principals' endpoints per read
    assert await gauge() == 0.0


async def test_a_body_that_stalls_is_408_within_the_read_timeout(start: Started, tmp_path: Path) -> None:
    """An authenticated client that sends its headers and part of its body, then nothing, holds no handler past
    ``read_timeout_s``: 408 JSON (over a raw socket; the wait is a hang detector, never a timing)."""
    import asyncio

    _, client = await start(settings_for(tmp_path, read_timeout_s=0.5))
    url = client.make_url("/mcp")
    reader, writer = await asyncio.open_connection(url.host, url.port)
    try:
        head = (f"POST /mcp HTTP/1.1\r\nHost: {url.host}\r\nAuthorization: Bearer {CONTROLLER}\r\n"
                "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
                "Content-Length: 500\r\n\r\n{\"jsonrpc\": ")
        writer.write(head.encode())
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(4096), timeout=HANG_S)
    finally:
        writer.close()
    status_line, _, rest = answer.partition(b"\r\n")
    assert b" 408 " in status_line, answer
    assert json.loads(rest.partition(b"\r\n\r\n")[2])["error"] == "request_timeout"


async def test_a_failure_of_the_service_is_a_json_503_never_a_traceback_to_the_client(
    start: Started, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run token looked up while the grant store fails: 503 JSON with the next action (the log has the rest)."""
    from state.grants import GrantStore

    async def broken(self: object, digest: str) -> None:
        raise RuntimeError("database unreachable")

    monkeypatch.setattr(GrantStore, "run_for_token", broken)
    _, client = await start(settings_for(tmp_path))
    status, _, doc = await raw(str(client.make_url("/mcp")), headers={"Authorization": "Bearer frun_some-run"})
    assert status == 503 and doc["error"] == "unavailable" and doc["exact_next_action"], doc


async def test_logins_that_differ_in_case_are_two_principals(start: Started, tmp_path: Path) -> None:
    """``Boss`` (a controller) and ``boss`` (an author) are served as themselves whichever connects first, as over
    stdio; one login's server never answers the other's token."""
    upper, lower = "tok-Boss-0123456789abcdef", "tok-boss-0123456789abcdef"
    settings = make_settings(tmp_path, roster={"Boss": ["controller"], "boss": ["author"]},
                             mcp={"token_digests": {"Boss": digest(upper), "boss": digest(lower)}})
    _, client = await start(settings)
    url = str(client.make_url("/mcp"))
    for token, login, roles in ((upper, "Boss", ["controller"]), (lower, "boss", ["author"])):
        async with mcp_over_http(url, token) as session:
            identity = (await call(session, "gitea_get_runtime_context"))["identity"]
        assert (identity["login"], identity["roles"]) == (login, roles), identity


async def test_open_sessions_are_bounded_per_principal_and_in_all(start: Started, tmp_path: Path) -> None:
    """``max_sessions`` per identity, ``max_sessions_total`` over all: one more ``initialize`` is 503 (JSON), and an
    open session's requests go on."""
    _, client = await start(settings_for(tmp_path, max_sessions=2, max_sessions_total=3))
    url = str(client.make_url("/mcp"))
    mine = {"Authorization": f"Bearer {AUTHOR_SECRET}"}
    assert [(await raw(url, headers=mine))[0] for _ in range(3)] == [200, 200, 503]
    status, _, doc = await raw(url, headers={"Authorization": f"Bearer {REVIEWER_SECRET}"})
    assert status == 200, doc
    status, _, doc = await raw(url, headers={"Authorization": f"Bearer {CONTROLLER}"})
    assert status == 503 and doc["error"] == "too_many_sessions" and doc["exact_next_action"], doc


async def test_a_swept_endpoint_is_never_one_a_request_holds_and_requests_in_flight_are_bounded(
    start: Started, tmp_path: Path
) -> None:
    """The idle sweep leaves an endpoint a request holds (counted from the moment the request takes it), and
    stops it once it is free and idle; a principal past ``max_requests_in_flight`` gets 429."""
    from bot.mcp_http import IDLE_PRINCIPAL_S, Principal, _Endpoint

    service, client = await start(settings_for(tmp_path, max_requests_in_flight=1))
    http = service.mcp
    assert http is not None
    url = str(client.make_url("/mcp"))
    assert (await raw(url, headers={"Authorization": f"Bearer {AUTHOR_SECRET}"}))[0] == 200
    principal = Principal(key="identity:author-1", login="author-1")
    held = await http._endpoint(principal)  # a request holding it (in flight)
    assert isinstance(held, _Endpoint) and held is http._endpoints[principal.key]
    status, _, doc = await raw(url, headers={"Authorization": f"Bearer {AUTHOR_SECRET}"})
    assert status == 429 and doc["error"] == "too_many_requests", doc
    later = held.last_used + IDLE_PRINCIPAL_S + 120
    held.manager._server_instances.clear()  # its session gone: idle but for the request
    http._last_sweep = 0.0
    http._sweep(later)
    assert http._endpoints.get(principal.key) is held
    held.in_flight -= 1
    http._last_sweep = 0.0
    http._sweep(later)
    assert principal.key not in http._endpoints
    assert (await raw(url, headers={"Authorization": f"Bearer {AUTHOR_SECRET}"}))[0] == 200  # a new endpoint
