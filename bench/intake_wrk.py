"""The intake benchmark's load through ``wrk`` (one thread): the signed requests written whole to a file beforehand,
``bench/intake_wrk.lua`` walking them, its figures read back from wrk's ``done()``.

wrk's Lua has no HMAC, so each request is built here, head and body, exactly as sent: ``POST /webhook HTTP/1.1``,
the Gitea headers (a unique ``X-Gitea-Delivery``, the hex HMAC-SHA256 ``X-Gitea-Signature``), ``Content-Length``.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LUA = Path(__file__).with_name("intake_wrk.lua")
#: Requests past the round's count that the file still holds: wrk stops after ``limit`` answers, and the requests
#: already sent on the other connections by then are unique deliveries too (stored, never answered to wrk).
MARGIN = 128


def wrk_path() -> str | None:
    return shutil.which("wrk")


def raw_request(body: bytes, headers: dict[str, str], path: str = "/webhook") -> bytes:
    head = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items()),
            f"Content-Length: {len(body)}", "", ""]
    return "\r\n".join(head).encode() + body


def write_requests(path: Path, requests: Sequence[tuple[bytes, dict[str, str]]]) -> None:
    """The records ``<length>\\n<raw request>`` the Lua script reads at init."""
    with path.open("wb") as out:
        for body, headers in requests:
            raw = raw_request(body, headers)
            out.write(b"%d\n" % len(raw))
            out.write(raw)


@dataclass
class WrkResult:
    seconds: float
    sent: int
    answered: int
    statuses: dict[int, int]
    p50_ms: float
    p99_ms: float
    max_ms: float
    socket_errors: dict[str, int]
    wrapped: int
    output: str

    @classmethod
    def parse(cls, output: str) -> WrkResult:
        lines = [line for line in output.splitlines() if line.startswith("BENCH_JSON ")]
        if not lines:
            raise ValueError(f"wrk printed no BENCH_JSON line:\n{output[-2000:]}")
        doc: dict[str, Any] = json.loads(lines[-1].removeprefix("BENCH_JSON "))
        statuses = {code: n for code, n in ((202, doc["s202"]), (200, doc["s200"]), (0, doc["sother"])) if n}
        return cls(seconds=doc["duration_us"] / 1e6, sent=doc["sent"], answered=doc["answered"], statuses=statuses,
                   p50_ms=doc["p50_us"] / 1000, p99_ms=doc["p99_us"] / 1000, max_ms=doc["max_us"] / 1000,
                   socket_errors={k: v for k, v in doc["errors"].items() if k != "status"}, wrapped=doc["wrapped"],
                   output=output)


async def run_wrk(url: str, requests_file: Path, limit: int, connections: int, timeout_s: float = 120.0) -> WrkResult:
    """One wrk run, one thread, ``connections`` connections, until ``limit`` answers (or ``timeout_s``)."""
    wrk = wrk_path()
    if wrk is None:
        raise FileNotFoundError("wrk is not installed (apt-get install -y wrk)")
    env = {"BENCH_REQUESTS": str(requests_file), "BENCH_LIMIT": str(limit), "PATH": "/usr/bin:/bin"}
    proc = await asyncio.create_subprocess_exec(
        wrk, "-t1", f"-c{connections}", f"-d{int(timeout_s)}s", f"--timeout={int(timeout_s)}s", "-s", str(LUA), url,
        env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout_s + 30)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    return WrkResult.parse(out.decode(errors="replace"))
