"""The configured database: created 0600 with its -wal/-shm files; check_writable() (/readyz) fails when it must."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path

import pytest

from bot.config import ConfigError, Settings, load_settings
from state.db import Database, DatabaseNotWritable, read_only
from state.db_postgres import PostgresDatabase
from state.sql import redact_url
from tests.serve_support import run_foreman

pytestmark = [pytest.mark.process]


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def _refused_while_chmodded(db: Database, path: Path, mode: int, *, restore: int, match: str) -> None:
    """check_writable() refuses while ``path`` has ``mode``; the mode is restored and the database closed after."""
    try:
        os.chmod(path, mode)
        with pytest.raises(DatabaseNotWritable, match=match):
            await db.check_writable()
    finally:
        os.chmod(path, restore)
        await db.close()


async def test_a_new_database_and_its_wal_and_shm_files_are_0600(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        db = await Database.open(tmp_path / "var" / "foreman.db")
    finally:
        os.umask(old)
    try:
        async with db.transaction() as conn:
            await conn.execute("CREATE TABLE t (x)")
        files = [tmp_path / "var" / name for name in ("foreman.db", "foreman.db-wal", "foreman.db-shm")]
        assert all(path.exists() for path in files)
        assert [_mode(path) for path in files] == [0o600, 0o600, 0o600]
    finally:
        await db.close()


async def test_an_existing_world_readable_database_is_tightened_to_0600(tmp_path: Path) -> None:
    path = tmp_path / "foreman.db"
    db = await Database.open(path)
    await db.close()
    os.chmod(path, 0o644)
    db = await Database.open(path)
    try:
        assert _mode(path) == 0o600
    finally:
        await db.close()


async def test_check_writable_passes_on_a_healthy_database(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "foreman.db")
    try:
        await db.check_writable()
        await db.check_writable()
        async with db.reader.execute("SELECT name FROM sqlite_master WHERE name LIKE '%probe%'") as cur:
            assert await cur.fetchall() == []  # the probe leaves nothing behind
    finally:
        await db.close()


async def test_check_writable_fails_when_the_database_refuses_writes(tmp_path: Path) -> None:
    """SQLITE_READONLY: today /readyz called such a database writable (its probe wrote nothing)."""
    db = await Database.open(tmp_path / "foreman.db")
    try:
        await db.reader.execute("PRAGMA query_only = ON")
        with pytest.raises(DatabaseNotWritable, match="read-only"):
            await db.check_writable()
    finally:
        await db.close()


async def test_check_writable_fails_on_a_read_only_copy_of_the_file(tmp_path: Path) -> None:
    source = await Database.open(tmp_path / "source.db")
    await source.close()
    copy = tmp_path / "copy" / "foreman.db"
    copy.parent.mkdir()
    shutil.copy(tmp_path / "source.db", copy)
    await _refused_while_chmodded(await Database.open(copy), copy, 0o400, restore=0o600, match="read-only")


async def test_check_writable_fails_on_a_read_only_folder(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    db = await Database.open(folder / "foreman.db")
    await _refused_while_chmodded(db, folder, 0o500, restore=0o700, match="folder")


async def test_check_writable_fails_when_the_database_is_full(tmp_path: Path) -> None:
    """SQLITE_FULL: a database at its max_page_count (what a full disk looks like to SQLite)."""
    db = await Database.open(tmp_path / "foreman.db")
    try:
        await db.reader.execute("VACUUM")  # no free pages left to reuse: the next write must grow the file
        async with db.reader.execute("PRAGMA page_count") as cur:
            row = await cur.fetchone()
        assert row is not None
        await db.reader.execute(f"PRAGMA max_page_count = {int(row[0])}")
        with pytest.raises(DatabaseNotWritable, match="full"):
            await db.check_writable()
    finally:
        await db.close()


async def test_check_writable_fails_when_the_disk_is_nearly_full(tmp_path: Path) -> None:
    db = await Database.open(tmp_path / "foreman.db")
    try:
        free = shutil.disk_usage(tmp_path).free
        with pytest.raises(DatabaseNotWritable, match="free"):
            await db.check_writable(min_free_bytes=free * 2 + 1)
        await db.check_writable(min_free_bytes=1)
    finally:
        await db.close()


# --- PostgreSQL: [database] url -----------------------------------------------------------------------------------


def _settings(tmp_path: Path, database: str) -> Settings:
    config = tmp_path / "foreman.toml"
    config.write_text(f"[database]\n{database}\n[webhook]\nsecrets = [\"a-long-enough-test-secret\"]\n")
    return load_settings(config, environ={})


def test_a_postgresql_url_selects_postgresql_and_is_shown_without_its_password(tmp_path: Path) -> None:
    settings = _settings(tmp_path, 'url = "postgresql://foreman:s3cret-pw@db.example:5433/foreman?sslmode=require"')
    assert settings.database.backend == "postgresql"
    assert settings.database.describe() == "postgresql://foreman:***@db.example:5433/foreman?sslmode=require"
    assert "s3cret-pw" not in repr(settings.database) and "s3cret-pw" not in settings.database.describe()
    assert settings.database.postgres_url() == "postgresql://foreman:s3cret-pw@db.example:5433/foreman?sslmode=require"
    assert redact_url("postgresql://h/db?user=u&password=pw2&sslmode=require") == (
        "postgresql://h/db?user=u&password=***&sslmode=require")
    assert _settings(tmp_path, 'path = "f.db"').database.backend == "sqlite"


def test_path_and_url_together_are_refused_naming_both_keys(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as refused:
        _settings(tmp_path, 'path = "f.db"\nurl = "postgresql://foreman@127.0.0.1/foreman"')
    assert "database.path" in str(refused.value) and "database.url" in str(refused.value)


def test_a_url_of_another_scheme_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"database\.url.*postgresql://"):
        _settings(tmp_path, 'url = "mysql://foreman@127.0.0.1/foreman"')


async def test_check_writable_passes_on_postgresql_and_fails_on_a_read_only_session(postgres_url: str) -> None:
    """/readyz on PostgreSQL: a real write, rolled back; a read-only session (a standby, or
    default_transaction_read_only) is `read_only`, and an unreachable server is a typed refusal, not a traceback."""
    db = await PostgresDatabase.connect(postgres_url)
    try:
        await db.check_writable()
        await db.check_writable()
        async with db.reader.execute("SELECT probes FROM foreman_write_probe") as cur:
            assert [tuple(row) for row in await cur.fetchall()] == [(0,)]  # the probe's write was rolled back
    finally:
        await db.close()
    async with read_only(postgres_url) as reader:
        with pytest.raises(DatabaseNotWritable) as refused:
            await reader.check_writable()
        assert refused.value.reason == "read_only"
        assert await reader.schema_version() > 0
    with pytest.raises(DatabaseNotWritable) as unreachable:
        await PostgresDatabase.connect("postgresql://nobody:pw-not-shown@127.0.0.1:1/none?connect_timeout=2")
    assert unreachable.value.reason == "unavailable" and "pw-not-shown" not in str(unreachable.value)


def test_the_url_can_come_from_a_file_and_a_file_without_one_is_refused(tmp_path: Path) -> None:
    (tmp_path / "db-url").write_text("postgresql://foreman:from-a-file@db.example/foreman\n")
    settings = _settings(tmp_path, 'url_file = "db-url"')
    assert settings.database.postgres_url() == "postgresql://foreman:from-a-file@db.example/foreman"
    assert settings.database.describe() == "postgresql://foreman:***@db.example/foreman"
    (tmp_path / "not-a-url").write_text("foreman.db\n")
    with pytest.raises(ConfigError, match=r"database\.url_file.*postgresql://"):
        _settings(tmp_path, 'url_file = "not-a-url"')
    with pytest.raises(ConfigError, match=r"database\.url_file.*not both"):
        _settings(tmp_path, 'url_file = "db-url"\nurl = "postgresql://h/db"')
    with pytest.raises(ConfigError, match=r"database\.path.*database\.url_file"):
        _settings(tmp_path, 'url_file = "db-url"\npath = "f.db"')


async def _foreman(tmp_path: Path, database_url: str, *command: str) -> tuple[int, str]:
    """`python -m bot COMMAND` over a config naming ``database_url``: exit code and stdout + stderr."""
    config = tmp_path / "foreman.toml"
    config.write_text(
        f'[webhook]\nsecrets = ["a-long-enough-test-secret"]\n[database]\nurl = "{database_url}"\n'
        '[gitea]\nurl = "http://127.0.0.1:1"\ntoken = "not-a-real-token"\ntimeout_s = 1.0\n'
        '[repository]\nowner = "acme"\nname = "widgets"\n',
        encoding="utf-8",
    )
    code, out, err = await run_foreman(*command, "--config", str(config), cwd=tmp_path)
    return code, out + err


@pytest.mark.parametrize("command", [("invariants", "--json"), ("check-config", "--json"), ("leases", "--json")])
async def test_a_url_libpq_cannot_parse_is_refused_without_echoing_its_password(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """libpq's parse error quotes the bad token (here the password): the CLI refuses at config load with the
    URL redacted, never a traceback or the password."""
    code, output = await _foreman(tmp_path, "postgresql://postgres:p%zzsecretpw@127.0.0.1/test", *command)
    assert code != 0 and "secretpw" not in output and "Traceback" not in output, output
    assert "postgresql://postgres:***@127.0.0.1/test" in output and "database.url" in output, output


@pytest.mark.parametrize("command", [("invariants", "--json"), ("leases", "--json")])
async def test_a_multi_host_url_that_cannot_connect_is_a_typed_refusal(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """libpq's failover form (several host:port) and a port out of range are URLs urllib cannot take apart:
    still shown redacted, and a server not reachable there is the database_unavailable envelope."""
    url = "postgresql://postgres:multi-host-pw@127.0.0.1:1,127.0.0.1:2/test?connect_timeout=2"
    code, output = await _foreman(tmp_path, url, *command)
    assert code != 0 and "multi-host-pw" not in output and "Traceback" not in output, output
    assert '"database_unavailable"' in output and "postgresql://postgres:***@127.0.0.1:1,127.0.0.1:2/test" in output
    code, output = await _foreman(tmp_path, "postgresql://postgres:big-port-pw@127.0.0.1:99999/test", *command)
    assert code != 0 and "big-port-pw" not in output and "Traceback" not in output, output


async def test_connect_refuses_an_unparsable_url_typed_and_redacted() -> None:
    """The opener itself (a URL that came by another way than the config) refuses typed, naming only the class."""
    with pytest.raises(DatabaseNotWritable) as refused:
        await PostgresDatabase.connect("postgresql://postgres:p%zzsecretpw@127.0.0.1/test")
    assert refused.value.reason == "unavailable"
    assert "secretpw" not in str(refused.value) and "ProgrammingError" in str(refused.value)
    assert "postgresql://postgres:***@127.0.0.1/test" in str(refused.value)
    with pytest.raises(DatabaseNotWritable) as read_refused:
        async with read_only("postgresql://postgres:p%zzsecretpw@127.0.0.1/test"):
            pass
    assert "secretpw" not in str(read_refused.value)


def test_a_url_file_libpq_cannot_parse_is_refused_redacted(tmp_path: Path) -> None:
    (tmp_path / "db-url").write_text("postgresql://foreman:p%zzfile-pw@db.example/foreman\n")
    with pytest.raises(ConfigError) as refused:
        _settings(tmp_path, 'url_file = "db-url"')
    assert "database.url_file" in str(refused.value) and "file-pw" not in str(refused.value)
    assert "postgresql://foreman:***@db.example/foreman" in str(refused.value)


async def _foreman_sqlite(tmp_path: Path, db_path: Path, *command: str) -> tuple[int, str, str]:
    """`python -m bot COMMAND` over a config naming the SQLite ``db_path``: exit code, stdout, stderr. The process
    is killed if it has not ended within the hang detector's 60 s."""
    config = tmp_path / "foreman.toml"
    config.write_text(
        f'[server]\nport = 0\n[webhook]\nsecrets = ["a-long-enough-test-secret"]\n[database]\npath = "{db_path}"\n',
        encoding="utf-8",
    )
    return await run_foreman(*command, "--config", str(config), cwd=tmp_path)


@pytest.mark.parametrize("made", ["read-only file", "read-only folder", "not a database"])
async def test_a_database_path_foreman_cannot_write_is_one_config_error_line_from_serve_and_the_cli(
    tmp_path: Path, made: str
) -> None:
    """Issue 29 item 6: `foreman serve` (and any command) on a read-only foreman.db ended with a PermissionError
    or sqlite3 traceback; now one JSON line on stderr, exit 2: invalid_config naming database.path, its reason and
    what to do. The file is never made writable behind the operator's back (a chmod it has no right to)."""
    folder = tmp_path / "data"
    db_path = folder / "foreman.db"
    await (await Database.open(db_path)).close()
    changed: Path | None = None
    try:
        if made == "read-only file":
            changed, reason, said = db_path, "read_only", "the file is read-only (mode 0444)"
            os.chmod(db_path, 0o444)
        elif made == "read-only folder":
            changed, reason, said = folder, "read_only", f"its folder {folder} is read-only (mode 0500)"
            os.chmod(folder, 0o500)
        else:
            db_path.write_bytes(b"not a database, whatever it was" * 200)
            reason, said = "not_a_database", "file is not a database"
        for command in (("serve",), ("deliveries", "--json")):
            code, out, err = await _foreman_sqlite(tmp_path, db_path, *command)
            assert code == 2 and out == "", (command, code, out, err)
            [line] = err.splitlines()
            envelope = json.loads(line)
            assert (envelope["error"], envelope["key"], envelope["reason"]) == ("invalid_config", "database.path",
                                                                                reason), envelope
            assert str(db_path) in envelope["message"] and said in envelope["message"], envelope
            assert envelope["exact_next_action"] and "Traceback" not in err
        if changed is not None:
            assert stat.S_IMODE(changed.stat().st_mode) in (0o444, 0o500)  # left as the operator set it
    finally:
        if changed is not None:
            os.chmod(changed, 0o700 if changed.is_dir() else 0o600)
