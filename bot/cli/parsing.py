"""The parts of `foreman`'s parser: the parser that refuses instead of exiting, and the argument types."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from typing import Any

from bot.core.vocabulary import MAX_ISSUE_NUMBER, is_issue_number


class UsageError(Exception):
    """A command line that cannot be read: exit 2 with the invalid_input envelope (never argparse's exit)."""

    def __init__(self, message: str, usage: str) -> None:
        super().__init__(message)
        self.message = message
        self.usage = usage

    def envelope(self) -> dict[str, Any]:
        return {
            "error": "invalid_input",
            "message": self.message,
            "remediate": "Give every option at most once (list options such as --exclude take several values, "
            "repeated or after one flag) with a value of the documented type; see `foreman <command> --help`.",
            "exact_next_action": f"run the command again as: {self.usage}",
        }


class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of exiting, and refuses a one-value option given twice."""

    def error(self, message: str) -> Any:  # argparse's signature is NoReturn; raising keeps it so
        raise UsageError(f"{self.prog}: {message}", " ".join(self.format_usage().split()).removeprefix("usage: "))

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if args and str(args[0]).startswith("-") and kwargs.get("action", "store") == "store":
            kwargs["action"] = _Once
        return super().add_argument(*args, **kwargs)


class _Once(argparse.Action):
    """Store one value; a second occurrence is refused (it would silently replace the first)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: str | None = None
    ) -> None:
        marker = f"_given_{self.dest}"
        if getattr(namespace, marker, False):
            raise argparse.ArgumentError(self, "given more than once; give it once")
        setattr(namespace, marker, True)
        setattr(namespace, self.dest, values)


_DIGITS = re.compile(r"[0-9]{1,19}")


def _positive_int64(what: str) -> Callable[[str], int]:
    """An argparse type: a decimal integer in 1..2^63-1 (what SQLite and Gitea store), else a clear refusal."""

    def parse(text: str) -> int:
        value = int(text) if _DIGITS.fullmatch(text) else 0
        if not is_issue_number(value):
            shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
            raise argparse.ArgumentTypeError(f"{shown!r} is not {what} (a whole number from 1 to {MAX_ISSUE_NUMBER})")
        return value

    parse.__name__ = what
    return parse


_issue_number = _positive_int64("an issue number")
_row_id = _positive_int64("a row id")
_count = _positive_int64("a positive count")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive, finite number of seconds")
    return value


def _delivery_ref(text: str) -> str:
    """A row id (digits, within int64) or a Gitea delivery id."""
    if text.isdigit() or not text.strip():
        _row_id(text)
    return text


_JSON_HELP = "print exactly one JSON document on stdout (logs go to stderr)"
_LIMIT_HELP = "show at most N rows (default: %(default)s)"


def _port(text: str) -> int:
    value = int(text) if _DIGITS.fullmatch(text) else -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a port (0 to 65535)")
    return value
