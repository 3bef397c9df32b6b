"""The allocator benchmark's data: a SQLite file of n open issues and their leases, and loading what decide takes."""

from __future__ import annotations

import json
import random
import sqlite3
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bot.core.allocator import LiveLease

REPO = "org/repo"
OWNER = "agent-bench"  # holds no lease: the decision is `select`
RESUME_OWNER = "agent-resume"  # holds one lease on a non-excluded issue: the decision is `resume`
FOREIGN_OWNERS = tuple(f"agent-{i:02d}" for i in range(1, 21))
NOW = datetime(2026, 5, 4, 12, 0, 0, tzinfo=UTC)  # fixed, so the data (and the fingerprint) repeat run to run
PRIORITIES = ("priority:p0", "priority:p1", "priority:p2", "priority:p3", None)
PRIORITY_WEIGHTS = (2, 10, 25, 23, 40)  # percent; 40% carry no priority label
OTHER_LABELS = ("kind:bug", "kind:feature", "kind:chore", "area:api", "area:ui", "area:worker", "status:ready")
OFFSETS = ("Z", "+00:00", "+02:00", "+05:30", "+09:00", "-05:00", "-07:00")
EXCLUDED_SHARE = 0.10
LEASED_SHARE = 0.10
DEPENDS_SHARE = 0.05

SCHEMA = """
CREATE TABLE issues (number INTEGER PRIMARY KEY, title TEXT NOT NULL, labels_json TEXT NOT NULL,
    created_at TEXT NOT NULL, body TEXT NOT NULL, depends_on_json TEXT NOT NULL DEFAULT '[]');
CREATE TABLE leases (id INTEGER PRIMARY KEY, lease_id TEXT NOT NULL UNIQUE, repo TEXT NOT NULL,
    issue_number INTEGER NOT NULL, owner TEXT NOT NULL, role TEXT NOT NULL, action TEXT NOT NULL,
    acquired_at TEXT NOT NULL, expires_at TEXT NOT NULL, heartbeat_at TEXT NOT NULL, status TEXT NOT NULL,
    ended_at TEXT, end_reason TEXT, fingerprint TEXT, version INTEGER NOT NULL DEFAULT 0);
CREATE UNIQUE INDEX leases_one_live_per_issue ON leases (repo, issue_number) WHERE status = 'live';
"""
SELECT_ISSUES = "SELECT number, title, labels_json, created_at, depends_on_json FROM issues"
SELECT_LEASES = "SELECT issue_number, owner, role, lease_id, expires_at FROM leases WHERE repo = ? AND status = 'live'"


@dataclass(frozen=True)
class Dataset:
    """What was written to the database, and the parts of it the checks need."""

    n: int
    excluded: list[int]  # exclude_issue_numbers, in the order the caller sends them
    foreign_leased: frozenset[int]
    own_lease_issue: int  # RESUME_OWNER's lease (foreign to OWNER)
    own_lease_id: str
    with_deps: int
    lease_rows: int  # live + ended


def _rfc3339(rng: random.Random, latest: datetime) -> str:
    """A creation time in the three years before ``latest``, with a random offset (and some microseconds)."""
    when = latest - timedelta(seconds=rng.randrange(3 * 365 * 86400))
    offset = rng.choice(OFFSETS)
    delta = timedelta(0) if offset == "Z" else datetime.strptime(offset, "%z").utcoffset() or timedelta(0)
    local = when.astimezone(UTC).replace(tzinfo=None) + delta
    text = local.strftime("%Y-%m-%dT%H:%M:%S")
    if rng.random() < 0.2:
        text += f".{rng.randrange(1_000_000):06d}"
    return text + offset


def _lease_id(rng: random.Random) -> str:
    return f"lease-{rng.getrandbits(128):032x}"


def build_database(path: Path, n: int, seed: int) -> Dataset:
    """n open issues numbered 1..n; 10% excluded, another 10% leased to foreign owners, 5% with depends_on."""
    rng = random.Random(seed * 1_000_003 + n)
    numbers = list(range(1, n + 1))
    picked = rng.sample(numbers, int(n * EXCLUDED_SHARE) + int(n * LEASED_SHARE) + 1)
    excluded = picked[: int(n * EXCLUDED_SHARE)]
    foreign = picked[int(n * EXCLUDED_SHARE) : -1]
    own_issue = picked[-1]
    issue_rows = []
    with_deps = 0
    for number in numbers:
        labels = rng.sample(OTHER_LABELS, rng.randrange(3))
        priority = rng.choices(PRIORITIES, PRIORITY_WEIGHTS)[0]
        if priority is not None:
            labels.insert(rng.randrange(len(labels) + 1), priority)
        deps: list[int] = []
        if rng.random() < DEPENDS_SHARE:
            with_deps += 1
            for _ in range(rng.randint(1, 3)):
                # 80% point at another open issue (a hold), 20% at a closed one (no hold): n+1.. are closed
                dep = rng.randint(1, n) if rng.random() < 0.8 else rng.randint(n + 1, 2 * n)
                if dep != number and dep not in deps:
                    deps.append(dep)
        title = f"Issue {number}: {rng.choice(('fix', 'add', 'refactor', 'document'))} the {rng.choice(OTHER_LABELS)}"
        body = f"Steps and context for #{number}. " * rng.randint(2, 12)
        issue_rows.append((number, title, json.dumps(labels), _rfc3339(rng, NOW), body, json.dumps(deps)))

    lease_rows = []

    def lease(issue: int, owner: str, status: str, expires: datetime) -> str:
        lid = _lease_id(rng)
        acquired = expires - timedelta(minutes=30)
        ended = None if status == "live" else (expires - timedelta(minutes=rng.randint(1, 29))).isoformat()
        lease_rows.append(
            (
                lid,
                REPO,
                issue,
                owner,
                rng.choice(("developer", "reviewer")),
                "work",
                acquired.isoformat(),
                expires.isoformat(),
                (expires - timedelta(minutes=25)).isoformat(),
                status,
                ended,
                None if status == "live" else "released",
                None,
                rng.randint(0, 5),
            )
        )
        return lid

    for issue in foreign:
        lease(issue, rng.choice(FOREIGN_OWNERS), "live", NOW + timedelta(seconds=rng.randint(60, 1800)))
    own_id = lease(own_issue, RESUME_OWNER, "live", NOW + timedelta(minutes=20))
    for _ in range(n // 10):  # ended leases: history the store keeps, which the live query must skip
        lease(rng.randint(1, n), rng.choice(FOREIGN_OWNERS), "released", NOW - timedelta(hours=rng.randint(1, 5000)))

    conn = sqlite3.connect(path)
    try:
        conn.executescript(SCHEMA)
        conn.executemany("INSERT INTO issues VALUES (?, ?, ?, ?, ?, ?)", issue_rows)
        conn.executemany(
            "INSERT INTO leases (lease_id, repo, issue_number, owner, role, action, acquired_at, expires_at,"
            " heartbeat_at, status, ended_at, end_reason, fingerprint, version)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            lease_rows,
        )
        conn.commit()
    finally:
        conn.close()
    return Dataset(n=n, excluded=excluded, foreign_leased=frozenset(foreign), own_lease_issue=own_issue,
                   own_lease_id=own_id, with_deps=with_deps, lease_rows=len(lease_rows))


@dataclass(frozen=True)
class Loaded:
    candidates: list[dict[str, Any]]
    leases: list[LiveLease]
    open_issue_numbers: frozenset[int]


def load(conn: sqlite3.Connection) -> Loaded:
    """The baseline: read every open issue and every live lease and build what ``decide`` takes."""
    candidates = [
        {
            "issue_number": number,
            "title": title,
            "labels": json.loads(labels_json),
            "created_at": created_at,
            "depends_on": json.loads(depends_json),
        }
        for number, title, labels_json, created_at, depends_json in conn.execute(SELECT_ISSUES)
    ]
    leases = [
        LiveLease(issue_number=issue, owner=owner, role=role, lease_id=lid, expires_at=datetime.fromisoformat(exp))
        for issue, owner, role, lid, exp in conn.execute(SELECT_LEASES, (REPO,))
    ]
    return Loaded(candidates, leases, frozenset(c["issue_number"] for c in candidates))
