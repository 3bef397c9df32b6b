"""`foreman mcp --url URL` (issue 28 item 2): the stdio bridge, as a real subprocess driven by the SDK's stdio client
and on the raw wire, against a real Streamable HTTP server (tests/mcp_http_stub.py: the SDK's session manager behind
a bearer check, served by uvicorn)."""

from __future__ import annotations

import contextlib
import io
import json
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError

from bot.mcp_bridge import (
    MAX_LINE_BYTES,
    REFUSED_CODE,
    Refused,
    endpoint_of,
    mcp_arguments,
    refusal_of,
    sse_events,
    wants_bridge,
)
from bot.mcp_bridge.upstream import _Sse
from tests.conftest import REPO_ROOT
from tests.mcp_http_stub import GOOD_TOKEN, RATE_LIMITED_TOKEN
from tests.support import free_port

pytestmark = [pytest.mark.process]

#: A hang detector, never a timing: every wait here ends long before it on any machine that works.
HANG_S = 60.0

CLIENT = {"name": "raw", "version": "0"}
INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
              "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": CLIENT}}
INITIALIZED = {"jsonrpc": "2.0", "method": "notifications/initialized"}


# --- the server -------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stub:
    """A running tests/mcp_http_stub.py: its URL and the log of every HTTP request it got."""

    url: str
    port: int
    log: Path

    def requests(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text(encoding="utf-8").splitlines() if line]


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=HANG_S)


@contextlib.contextmanager
def stub_server(tmp_path: Path, *, json_response: bool, port: int | None = None) -> Iterator[Stub]:
    """The stub on a free loopback port (or ``port``), stopped whatever happens; ready once it accepts connections
    (uvicorn runs the lifespan, which starts the session manager, before it listens)."""
    port = port or free_port()
    log = tmp_path / "requests.jsonl"
    command = [sys.executable, "-m", "tests.mcp_http_stub", "--port", str(port), "--log", str(log)]
    with (tmp_path / f"stub-{port}-{time.monotonic_ns()}.err").open("wb") as errors:
        process = subprocess.Popen([*command, *(["--json-response"] if json_response else [])], cwd=REPO_ROOT,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors)
    try:
        deadline = time.monotonic() + HANG_S
        while True:
            assert process.poll() is None, f"the stub server exited with {process.returncode}"
            assert time.monotonic() < deadline, "the stub server did not listen within the hang detector"
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        yield Stub(url=f"http://127.0.0.1:{port}/mcp", port=port, log=log)
    finally:
        _stop(process)


@pytest.fixture(params=[False, True], ids=["sse", "json"])
def stub(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Stub]:
    """The stub answering with SSE streams, then with application/json bodies."""
    with stub_server(tmp_path, json_response=request.param) as running:
        yield running


def bridge_command(url: str) -> list[str]:
    return [sys.executable, "-m", "bot", "mcp", "--url", url]


@asynccontextmanager
async def bridged(url: str, token: str = GOOD_TOKEN) -> AsyncIterator[ClientSession]:
    """The bridge started by the SDK's stdio client, a client session over it (not initialized)."""
    command, *args = bridge_command(url)
    params = StdioServerParameters(command=command, args=args, env={"FOREMAN_MCP_TOKEN": token}, cwd=REPO_ROOT)
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        yield session


# --- the raw wire -----------------------------------------------------------------------------------------------------


class RawBridge:
    """The bridge as a subprocess on the raw wire: lines in, lines out (read by a thread into a queue)."""

    def __init__(self, url: str, *, token: str | None = GOOD_TOKEN, extra: tuple[str, ...] = ()) -> None:
        env = {"PATH": "/usr/bin:/bin", **({"FOREMAN_MCP_TOKEN": token} if token is not None else {})}
        self.process = subprocess.Popen(
            [sys.executable, *extra, "-m", "bot", "mcp", "--url", url], cwd=REPO_ROOT, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        self._lines: queue.Queue[bytes] = queue.Queue()
        self._errors = io.BytesIO()
        assert self.process.stdout is not None and self.process.stderr is not None
        self._threads = [threading.Thread(target=self._pump, args=(self.process.stdout, self._lines.put), daemon=True),
                         threading.Thread(target=self._pump, args=(self.process.stderr, self._errors.write),
                                          daemon=True)]
        for thread in self._threads:
            thread.start()

    @staticmethod
    def _pump(stream: IO[bytes], sink: Any) -> None:
        for line in iter(stream.readline, b""):
            sink(line)

    def send(self, *messages: dict[str, Any] | bytes) -> None:
        assert self.process.stdin is not None
        for message in messages:
            data = message if isinstance(message, bytes) else json.dumps(message).encode()
            self.process.stdin.write(data + b"\n")
        self.process.stdin.flush()

    def receive(self) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=HANG_S)
        except queue.Empty:
            raise AssertionError(f"no line from the bridge; its stderr: {self.stderr()}") from None
        message = json.loads(line)
        assert isinstance(message, dict), line
        return message

    def close_stdin(self) -> int:
        """End stdin; the exit code (the hang detector fails the test if it does not exit)."""
        assert self.process.stdin is not None
        self.process.stdin.close()
        code = self.process.wait(timeout=HANG_S)
        for thread in self._threads:
            thread.join(timeout=HANG_S)
        return code

    def stdout_rest(self) -> list[bytes]:
        return list(self._lines.queue)

    def stderr(self) -> str:
        return self._errors.getvalue().decode("utf-8", "replace")

    def stop(self) -> None:
        if self.process.stdin is not None:
            with contextlib.suppress(OSError):
                self.process.stdin.close()
        _stop(self.process)


@contextlib.contextmanager
def raw_bridge(url: str, **options: Any) -> Iterator[RawBridge]:
    bridge = RawBridge(url, **options)
    try:
        yield bridge
    finally:
        bridge.stop()


# --- through the SDK's stdio client -----------------------------------------------------------------------------------


async def test_initialize_list_and_call_go_through_the_bridge(stub: Stub) -> None:
    """Issue 28 item 2: a stdio-only host reaches /mcp through the bridge; the session id and the negotiated protocol
    version go on every request after initialize; two requests are in flight at once (``hold`` is answered only
    after ``release``, sent while ``hold`` waits)."""
    with anyio.fail_after(HANG_S):
        async with bridged(stub.url) as session:
            initialized = await session.initialize()
            tools = await session.list_tools()
            assert [tool.name for tool in tools.tools] == ["echo", "hold", "release"]
            echoed = await session.call_tool("echo", {"word": "héllo", "n": 2**70, "nested": {"a": [1, None]}})
            assert echoed.structured_content == {"tool": "echo",
                                                 "arguments": {"word": "héllo", "n": 2**70, "nested": {"a": [1, None]}}}
            held: list[Any] = []
            async with anyio.create_task_group() as group:
                async def hold() -> None:
                    held.append(await session.call_tool("hold", {}))

                group.start_soon(hold)
                released = await session.call_tool("release", {})
            assert released.structured_content == {"tool": "release", "arguments": {}}
            assert held[0].structured_content == {"tool": "hold", "arguments": {}}
    requests = stub.requests()
    first, *later = [r for r in requests if r["method"] == "POST"]
    assert (first["session"], first["version"]) == (None, None)
    session_ids = {r["session"] for r in later}
    assert len(session_ids) == 1 and None not in session_ids
    assert {r["version"] for r in later} == {initialized.protocol_version}
    assert all(r["good_token"] and r["content_type"] == "application/json"
               and r["accept"] == "application/json, text/event-stream" for r in requests if r["method"] == "POST")


@pytest.mark.parametrize(("token", "error", "needle"), [
    ("wrong-token", "unauthorized", "the bearer token is not known"),
    (RATE_LIMITED_TOKEN, "rate_limited", "(retry after 7 s)"),
])
async def test_a_refused_token_is_the_answer_to_the_first_request(
    tmp_path: Path, token: str, error: str, needle: str
) -> None:
    """A 401 (or 429) from the server answers the host's initialize with a JSON-RPC error carrying the server's
    refusal: the host shows it instead of waiting."""
    with stub_server(tmp_path, json_response=False) as running, anyio.fail_after(HANG_S):
        async with bridged(running.url, token) as session:
            with pytest.raises(MCPError) as refused:
                await session.initialize()
    assert refused.value.code == REFUSED_CODE
    assert refused.value.message.startswith(f"{error}: ") and needle in refused.value.message
    assert refused.value.data["error"] == error and "exact_next_action" in refused.value.data


async def test_a_server_that_is_down_is_a_clear_error_naming_the_url() -> None:
    """Nothing listens at the URL: the first request is answered with "unreachable", naming the URL."""
    url = f"http://127.0.0.1:{free_port()}/mcp"
    with anyio.fail_after(HANG_S):
        async with bridged(url) as session:
            with pytest.raises(MCPError) as refused:
                await session.initialize()
    assert refused.value.code == REFUSED_CODE
    assert refused.value.message.startswith("unreachable: ") and url in refused.value.message
    assert refused.value.data["url"] == url


async def test_a_restarted_server_gets_a_new_session_and_the_call_goes_through(tmp_path: Path) -> None:
    """The server answers 404 to a session it no longer knows (here: it restarted; also after its idle timeout):
    the bridge opens a new session with the host's own initialize and sends the request again."""
    port = free_port()
    with anyio.fail_after(HANG_S):
        async with bridged(f"http://127.0.0.1:{port}/mcp") as session:
            with stub_server(tmp_path, json_response=False, port=port):
                await session.initialize()
                await session.list_tools()
            with stub_server(tmp_path, json_response=False, port=port) as restarted:
                echoed = await session.call_tool("echo", {"after": "restart"})
                assert echoed.structured_content == {"tool": "echo", "arguments": {"after": "restart"}}
    initializes = [r for r in restarted.requests() if r["method"] == "POST" and r["session"] is None]
    assert len(initializes) == 2


# --- on the raw wire --------------------------------------------------------------------------------------------------


def test_a_line_that_is_not_json_gets_a_parse_error_and_the_session_goes_on(stub: Stub) -> None:
    """Garbage and an over-long line are each answered (parse error -32700, invalid request -32600; id null), and
    the requests around them are answered as usual."""
    with raw_bridge(stub.url) as bridge:
        bridge.send(b"this is not json")
        assert bridge.receive()["error"]["code"] == -32700
        bridge.send(INITIALIZE)
        assert bridge.receive()["result"]["serverInfo"]["name"] == "stub"
        bridge.send(INITIALIZED, b"{not json either", b"[]")
        parse_error = bridge.receive()
        assert (parse_error["id"], parse_error["error"]["code"]) == (None, -32700)
        assert bridge.receive()["error"]["code"] == -32600
        bridge.send(b'"x' + b"y" * MAX_LINE_BYTES + b'"')
        too_long = bridge.receive()
        assert (too_long["id"], too_long["error"]["code"]) == (None, -32600)
        bridge.send({"jsonrpc": "2.0", "id": "two", "method": "tools/list"})
        listed = bridge.receive()
        assert listed["id"] == "two" and len(listed["result"]["tools"]) == 3
        assert bridge.close_stdin() == 0
    assert "Traceback" not in bridge.stderr()


def test_stdin_eof_ends_the_session_with_delete_and_exit_0(stub: Stub) -> None:
    """stdin's end: the request still in flight is answered first, then DELETE with the session id, exit 0."""
    with raw_bridge(stub.url) as bridge:
        bridge.send(INITIALIZE, INITIALIZED)
        bridge.receive()
        bridge.send({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "echo", "arguments": {}}})
        assert bridge.close_stdin() == 0
        assert [json.loads(line)["id"] for line in bridge.stdout_rest()] == [2]
    session = next(r["session"] for r in stub.requests() if r["session"])
    deletes = [r for r in stub.requests() if r["method"] == "DELETE"]
    assert [(r["session"], r["good_token"]) for r in deletes] == [(session, True)]
    assert "Traceback" not in bridge.stderr() and GOOD_TOKEN not in bridge.stderr()


@pytest.mark.parametrize(("url", "token", "key"), [
    ("http://127.0.0.1:9/mcp", None, "FOREMAN_MCP_TOKEN"),
    ("http://127.0.0.1:9/mcp", "two words", "FOREMAN_MCP_TOKEN"),
    ("ftp://127.0.0.1/mcp", GOOD_TOKEN, "--url"),
    ("http:///mcp", GOOD_TOKEN, "--url"),
    ("http://user:secret@127.0.0.1/mcp", GOOD_TOKEN, "--url"),
])
def test_a_missing_token_or_a_bad_url_is_refused_at_start(url: str, token: str | None, key: str) -> None:
    """One JSON line on stderr, exit 2, and the host's first request answered with the refusal (not "connection
    closed"); the token and the URL's password are never printed."""
    with raw_bridge(url, token=token) as bridge:
        bridge.send(INITIALIZE)
        answer = bridge.receive()
        assert bridge.close_stdin() == 2
    assert answer["id"] == 1 and answer["error"]["code"] == REFUSED_CODE
    assert answer["error"]["data"]["key"] == key
    [line] = [line for line in bridge.stderr().splitlines() if line.strip()]
    assert json.loads(line)["key"] == key
    assert "secret" not in bridge.stderr() and "two words" not in bridge.stderr()


def test_the_bridge_imports_nothing_of_the_service(stub: Stub) -> None:
    """The bridge (a whole session: initialize, tools/list, stdin's end) loads no module of bot.cli, bot.config,
    state, aiohttp, mcp, pydantic, anyio or httpx2, and nothing of the package but itself (bot.mcp_bridge and its
    modules), bot/__main__.py and the standard-library-only bot.core.json_depth; importing bot.mcp_bridge alone
    neither."""
    forbidden = ("bot.cli", "bot.config", "state", "aiohttp", "mcp", "pydantic", "anyio", "httpx2", "starlette")

    def loaded(stderr: str) -> set[str]:
        return {line.rsplit("|", 1)[1].strip() for line in stderr.splitlines() if line.startswith("import time:")
                and not line.endswith("| package")}

    def offenders(modules: set[str]) -> list[str]:
        return sorted(m for m in modules if any(m == f or m.startswith(f"{f}.") for f in forbidden)
                      or (m.startswith("bot.") and m not in ("bot.__main__", "bot.mcp_bridge", "bot.core",
                                                             "bot.core.json_depth")
                          and not m.startswith("bot.mcp_bridge.")))  # the bridge's own modules

    with raw_bridge(stub.url, extra=("-X", "importtime")) as bridge:
        bridge.send(INITIALIZE, INITIALIZED, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
        assert bridge.receive()["id"] == 1 and bridge.receive()["id"] == 2
        assert bridge.close_stdin() == 0
    modules = loaded(bridge.stderr())
    assert {"bot", "bot.mcp_bridge", "http.client"} <= modules
    assert offenders(modules) == []
    alone = subprocess.run([sys.executable, "-X", "importtime", "-c", "import bot.mcp_bridge"], cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=HANG_S, check=True)
    assert offenders(loaded(alone.stderr)) == []


def test_foreman_mcp_help_shows_url() -> None:
    done = subprocess.run([sys.executable, "-m", "bot", "mcp", "--help"], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=HANG_S, check=False)
    assert done.returncode == 0 and "--url URL" in done.stdout and "operator's tool" in done.stdout


def test_the_in_process_server_says_it_is_an_operators_tool(tmp_path: Path) -> None:
    """`foreman mcp` without --url still serves in-process, and says on stderr that agents use /mcp or --url."""
    from tests.test_mcp_stdio import AUTHOR_TOKEN, foreman_mcp_command, mcp_config

    done = subprocess.run(foreman_mcp_command(mcp_config(tmp_path)), cwd=REPO_ROOT, input="", capture_output=True,
                          text=True, timeout=HANG_S, check=False,
                          env={"PATH": "/usr/bin:/bin", "FOREMAN_MCP_TOKEN": AUTHOR_TOKEN})
    assert done.returncode == 0, done.stderr
    assert "an operator's tool" in done.stderr and "--url" in done.stderr


# --- the pieces -------------------------------------------------------------------------------------------------------


def test_the_command_line_is_read_past_foremans_global_options() -> None:
    assert mcp_arguments(["--config", "x.toml", "mcp", "--url", "u"]) == ["--url", "u"]
    assert mcp_arguments(["--repository", "mcp", "serve"]) is None
    assert wants_bridge(["mcp", "--url=http://h/mcp"], {})
    assert wants_bridge(["--config=x", "mcp"], {"FOREMAN_MCP_URL": "http://h/mcp"})
    assert not wants_bridge(["mcp"], {})
    assert not wants_bridge(["mcp", "--url", "u", "--help"], {})
    assert not wants_bridge(["serve", "--url", "u"], {"FOREMAN_MCP_URL": "http://h/mcp"})


def test_endpoints() -> None:
    secure = endpoint_of("https://foreman.example:8443/mcp?x=1")
    assert not isinstance(secure, str)
    assert (secure.https, secure.host, secure.port, secure.target) == (True, "foreman.example", 8443, "/mcp?x=1")
    assert secure.shown == "https://foreman.example:8443/mcp"
    plain = endpoint_of("http://[::1]/mcp")
    assert not isinstance(plain, str) and (plain.port, plain.shown) == (80, "http://[::1]:80/mcp")
    for bad in ("foreman:8080/mcp", "http://h:99999/mcp", "http://h/m cp", "file:///mcp"):
        assert isinstance(endpoint_of(bad), str), bad


def test_sse_events_are_read_as_the_specification_frames_them() -> None:
    body = (b": a comment\n\nid: 7\ndata:\n\nevent: message\ndata: {\"a\":\r\ndata:  1}\r\n\r\n"
            b"event: other\ndata: {}\n\nretry: 250\ndata: [2]\n\ndata: {\"cut\": ")
    state = _Sse()
    assert [json.loads(data) for data in sse_events(io.BytesIO(body), state)] == [{"a": 1}, [2]]
    assert (state.last_id, state.retry_s) == ("7", 0.25)


def test_a_refusal_keeps_the_servers_json_or_the_start_of_its_body() -> None:
    jsonrpc = refusal_of(404, "Not Found", b'{"jsonrpc":"2.0","id":"x","error":{"code":-32600,"message":"gone"}}',
                         None)
    assert jsonrpc.message == "HTTP 404: gone" and jsonrpc.data["error"]["message"] == "gone"
    html = refusal_of(502, "Bad Gateway", b"<html>" + b"x" * 1000, "3")
    assert isinstance(html, Refused) and html.message == "HTTP 502: Bad Gateway (retry after 3 s)"
    assert html.data == {"status": 502, "body": "<html>" + "x" * 494}


# --- against a real `foreman serve`'s /mcp ----------------------------------------------------------------------------


@asynccontextmanager
async def foreman_serve(tmp_path: Path) -> AsyncIterator[str]:
    """A real `foreman serve` on tests/test_mcp_stdio.py's configuration; its ``/mcp`` URL."""
    from tests.serve_support import serve_process
    from tests.test_mcp_stdio import mcp_config

    config = mcp_config(tmp_path)
    async with serve_process(tmp_path, config=config, serve=True, graceful=True) as proc:
        yield f"{proc.url}/mcp"


async def test_through_the_bridge_foreman_serve_answers_as_it_answers_its_own_http_clients(tmp_path: Path) -> None:
    """Issue 28 item 2 against the service itself: the same tools (schemas included), the same allocation and the
    same policy refusal through the bridge as through the SDK's Streamable HTTP client; an unknown token is the
    service's own 401 refusal, as the answer to initialize."""
    from tests.mcp_http_support import mcp_over_http
    from tests.test_mcp_stdio import AUTHOR_TOKEN, CANARY, CONTROLLER_TOKEN, allocate, leases

    async with foreman_serve(tmp_path) as url:
        with anyio.fail_after(HANG_S):
            async with mcp_over_http(url, CONTROLLER_TOKEN) as direct:
                tools = [tool.model_dump() for tool in (await direct.list_tools()).tools]
                dry = await allocate(direct, candidates_json=CANARY, exclude_issue_numbers=[617])
            async with mcp_over_http(url, AUTHOR_TOKEN) as direct:
                refusal = await allocate(direct, candidates_json=CANARY, dry_run=False)
            async with bridged(url, CONTROLLER_TOKEN) as session:
                await session.initialize()
                assert [tool.model_dump() for tool in (await session.list_tools()).tools] == tools
                assert await allocate(session, candidates_json=CANARY, exclude_issue_numbers=[617]) == dry
                applied = await allocate(session, candidates_json=CANARY, exclude_issue_numbers=[617], dry_run=False,
                                         expected_fingerprint=dry["fingerprint"])
                assert applied["applied"] is True and applied["issue_number"] == 618, applied
            async with bridged(url, AUTHOR_TOKEN) as session:
                await session.initialize()
                assert await allocate(session, candidates_json=CANARY, dry_run=False) == refusal
                assert refusal["is_error"] is True and refusal["error"] == "not_authorized"
            async with bridged(url, "tok-guessed") as session:
                with pytest.raises(MCPError) as refused:
                    await session.initialize()
    assert refused.value.code == REFUSED_CODE and refused.value.message.startswith("unauthorized: ")
    assert refused.value.data["error"] == "unauthorized" and refused.value.data["exact_next_action"]
    assert leases(tmp_path / "foreman.db") == [(618, "author-1", "live")]


async def test_through_the_bridge_foreman_serve_enforces_exactly_its_published_schema(tmp_path: Path) -> None:
    """tests/test_mcp_stdio.py's schema probes (the 5,000-digit integer included: the bridge forwards the host's
    bytes, it does not parse them into numbers) through the bridge: invalid_input exactly where the listed schema
    says invalid."""
    from tests.test_mcp_stdio import CONTROLLER_TOKEN, STDIO_PROBES, assert_schema_enforced

    async with foreman_serve(tmp_path) as url:
        with anyio.fail_after(HANG_S * 3):
            async with bridged(url, CONTROLLER_TOKEN) as session:
                await session.initialize()
                await assert_schema_enforced(session, STDIO_PROBES)


async def test_through_the_bridge_arguments_the_sdk_parser_refuses_are_answered_invalid_input(
    tmp_path: Path
) -> None:
    """tests/test_mcp_stdio.py's raw-wire case, sent at once through the bridge to `foreman serve`: every request
    answered (the service's invalid_input, saying nothing ran), the last one served."""
    from tests.test_mcp_stdio import CONTROLLER_TOKEN, RAW_LINES, RAW_REQUESTS, assert_unreadable_answered

    answers: dict[int, dict[str, Any]] = {}
    async with foreman_serve(tmp_path) as url:
        with raw_bridge(url, token=CONTROLLER_TOKEN) as bridge:
            bridge.send(*(line.encode() for line in RAW_LINES))
            for _ in range(len(RAW_REQUESTS) + 1):  # initialize's answer and each request's
                message = await anyio.to_thread.run_sync(bridge.receive)
                answers[message["id"]] = message
            assert await anyio.to_thread.run_sync(bridge.close_stdin) == 0
    assert "Traceback" not in bridge.stderr()
    assert_unreadable_answered(answers)
    assert answers[5]["result"]["isError"] is False
