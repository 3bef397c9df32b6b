"""Smoke test of the bootstrap benchmark (bench/bootstrap.py) on a tiny repository; no timing is asserted."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from bench.bootstrap import commit_fast, generated_files
from tests.conftest import REPO_ROOT
from tests.gitea_fixtures import scratch_dir
from tests.support import HANG_S, SLOW_HANG_S

pytestmark = [pytest.mark.slow]


def test_generated_files_look_like_a_source_tree_and_fast_import_commits_them() -> None:
    files = generated_files(250)
    assert len(files) == 250 and len({name.split("/")[0] for name in files}) == 3
    root = scratch_dir("bench-smoke-")
    try:
        bare = root / "r.git"
        subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(bare)], check=True)
        tree = subprocess.run(["git", "mktree"], cwd=bare, input=b"", capture_output=True, check=True).stdout
        first = subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit-tree", "-m", "init",
                                tree.decode().strip()], cwd=bare, capture_output=True, check=True).stdout
        subprocess.run(["git", "update-ref", "refs/heads/main", first.decode().strip()], cwd=bare, check=True)
        commit_fast(bare, "main", files)
        listed = subprocess.run(["git", "ls-tree", "-r", "--name-only", "main"], cwd=bare, capture_output=True,
                                text=True, check=True).stdout.split()
        assert sorted(listed) == sorted(files)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_the_benchmark_runs_and_reports_both_figures_of_the_same_run() -> None:
    argv = [sys.executable, "-m", "bench.bootstrap", "--files", "40", "--repeat", "2", "--concurrent", "3", "--json"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=SLOW_HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and doc["errors"] == []
    assert doc["baseline_ms"]["n"] == doc["transition_ms"]["n"] == 2
    assert doc["baseline_ms"]["median"] > 0 and doc["transition_ms"]["median"] > 0 and doc["ratio"] > 0
    assert doc["target"]["ratio_at_most"] == 1.3 and doc["target"]["result"] in {"PASS", "MISS"}
    paired = doc["paired_ratio"]  # the verdict's figure: the median of the back-to-back pairs' ratios
    assert 0 < paired["min"] <= paired["median"] <= paired["max"] and doc["target"]["on"] == "paired_ratio.median"
    assert doc["peak_rss_mib"]["service"] > 0
    concurrent = doc["concurrent_result"]
    assert concurrent["issues"] == concurrent["completed"] == 3 and concurrent["plain_worktree_add_wall_ms"] > 0
    assert doc["registered_worktrees"] == 5
    assert set(doc["gitea_read_ms"]) == {"get_repo", "get_issue", "get_branch", "get_branch_404"}


def test_bad_arguments_are_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "bench.bootstrap", "--repeat", "0"], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=HANG_S, check=False)
    assert done.returncode == 2 and "--repeat" in done.stderr


def test_the_scale_benchmark_runs_both_revisions_side_by_side() -> None:
    """bench/bootstrap_scale.py (issue 19, item 3): both workers run their own code against one checkout, every
    size reports both sides and the plain add, and the worktrees reach each size; no timing is asserted."""
    argv = [sys.executable, "-m", "bench.bootstrap_scale", "--sizes", "1,4", "--repeat", "1", "--before", "HEAD",
            "--files", "10", "--json"]
    done = subprocess.run(argv, cwd=REPO_ROOT, capture_output=True, text=True, timeout=SLOW_HANG_S, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads(done.stdout)
    assert doc["ok"] is True and doc["errors"] == []
    assert doc["code"]["after"] == str(REPO_ROOT) and doc["code"]["before"] != str(REPO_ROOT)
    assert [row["size"] for row in doc["rows"]] == [1, 4]
    assert all(row["worktrees_at_start"] >= row["size"] for row in doc["rows"])
    for row in doc["rows"]:
        assert {name: len(values) for name, values in row["samples_ms"].items()} == {
            "before": 1, "after": 1, "plain_add": 1}
    assert set(doc["growth_last_over_first"]) == {"before", "after", "plain_add"}
    assert len(doc["load_start"]) == 3 and len(doc["load_end"]) == 3
