"""The backend seam's text work (state/sql.py): placeholders translated for PostgreSQL, URLs shown without their
password whatever libpq form they take."""

from __future__ import annotations

import pytest

from state.sql import (
    AmbiguousPlaceholder,
    placeholders_to_dollar,
    postgres_url_problem,
    redact_url,
    scrub,
    url_password,
)


def test_placeholders_are_numbered_in_order() -> None:
    assert placeholders_to_dollar("SELECT a FROM t WHERE b = ? AND c IN (?, ?)") == (
        "SELECT a FROM t WHERE b = $1 AND c IN ($2, $3)")


def test_a_question_mark_inside_quotes_or_identifiers_is_kept() -> None:
    assert placeholders_to_dollar("SELECT '?', \"a?\", 'it''s ?' FROM t WHERE x = ?") == (
        "SELECT '?', \"a?\", 'it''s ?' FROM t WHERE x = $1")


def test_a_question_mark_inside_a_line_comment_is_kept() -> None:
    assert placeholders_to_dollar("SELECT ? -- is it? 'no\nFROM t WHERE x = ?") == (
        "SELECT $1 -- is it? 'no\nFROM t WHERE x = $2")


def test_a_question_mark_inside_a_block_comment_is_kept() -> None:
    assert placeholders_to_dollar("SELECT /* why? it's ' here */ ? FROM t") == "SELECT /* why? it's ' here */ $1 FROM t"


def test_an_escape_string_with_a_backslashed_quote_is_one_literal() -> None:
    # E'\'' is one quote character: the ? after it is inside the literal until the real closing quote.
    assert placeholders_to_dollar("SELECT E'a\\' ?' , ?") == "SELECT E'a\\' ?' , $1"
    # Outside E'' a backslash is an ordinary character: 'a\' closes at its second quote.
    assert placeholders_to_dollar("SELECT 'a\\', ?") == "SELECT 'a\\', $1"


def test_a_dollar_quoted_body_is_kept_whole() -> None:
    assert placeholders_to_dollar("SELECT $$ ? ' $$, $fn$ ? $$ ? $fn$, ?") == "SELECT $$ ? ' $$, $fn$ ? $$ ? $fn$, $1"
    # A $ inside an identifier opens no tag.
    assert placeholders_to_dollar("SELECT col$x$ FROM t WHERE y = ?") == "SELECT col$x$ FROM t WHERE y = $1"


@pytest.mark.parametrize("statement", ["SELECT 1 FROM t WHERE d ?| ARRAY['a']", "SELECT 1 FROM t WHERE d ?& ARRAY['']"])
def test_the_jsonb_operators_are_refused_at_translation(statement: str) -> None:
    with pytest.raises(AmbiguousPlaceholder, match="JSONB operator"):
        placeholders_to_dollar(statement)


def test_the_url_forms_libpq_takes_are_shown_without_their_password() -> None:
    cases = {
        "postgresql://u:pw@h1:5432,h2:5432/db": "postgresql://u:***@h1:5432,h2:5432/db",
        "postgresql://u:pw@h:99999/db": "postgresql://u:***@h:99999/db",
        "postgresql://postgres:p%zzsecretpw@127.0.0.1/test": "postgresql://postgres:***@127.0.0.1/test",
        "postgresql://u:p@ss:w/rd@[::1]:5432/db?sslmode=require": "postgresql://u:***@[::1]:5432/db?sslmode=require",
        "postgresql://u@h/db?password=pw2&sslmode=require": "postgresql://u@h/db?password=***&sslmode=require",
        "postgresql://h/db": "postgresql://h/db",
        "postgres://u@h": "postgres://u@h",
    }
    assert {url: redact_url(url) for url in cases} == cases


def test_a_message_quoting_the_password_is_scrubbed() -> None:
    url = "postgresql://u:s%40cret@h/db"
    assert url_password(url) == "s%40cret"
    assert scrub('invalid token "s%40cret" and s@cret', url) == 'invalid token "***" and ***'
    assert scrub("nothing to hide", "postgresql://h/db") == "nothing to hide"


def test_a_url_libpq_cannot_parse_is_described_without_its_password() -> None:
    problem = postgres_url_problem("postgresql://postgres:p%zzsecretpw@127.0.0.1/test")
    assert problem is not None and "secretpw" not in problem and "postgresql://postgres:***@127.0.0.1/test" in problem
    assert postgres_url_problem("postgresql://u:pw@h1:5432,h2:5432/db") is None
