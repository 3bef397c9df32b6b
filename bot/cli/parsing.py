"""The parts of `foreman`'s parser: the parser that refuses instead of exiting, the argument types, and
:class:`Commands`, to which each command group's module (bot/cli/*.py) adds its subcommands (its ``register``)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable
from pathlib import Path
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


class Parser(argparse.ArgumentParser):
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


issue_number = _positive_int64("an issue number")
row_id = _positive_int64("a row id")
count = _positive_int64("a positive count")


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive, finite number of seconds")
    return value


def delivery_ref(text: str) -> str:
    """A row id (digits, within int64) or a Gitea delivery id."""
    if text.isdigit() or not text.strip():
        row_id(text)
    return text


JSON_HELP = "print exactly one JSON document on stdout (logs go to stderr)"
LIMIT_HELP = "show at most N rows (default: %(default)s)"


def port(text: str) -> int:
    value = int(text) if _DIGITS.fullmatch(text) else -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a port (0 to 65535)")
    return value


class Commands:
    """`foreman`'s subcommands: each takes ``--config`` and ``--repository`` after its name too (not shown)."""

    def __init__(self, subparsers: argparse._SubParsersAction[Parser]) -> None:
        self._subparsers = subparsers

    def add(self, name: str, help_text: str) -> argparse.ArgumentParser:
        cmd = self._subparsers.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        cmd.add_argument("--config", dest="sub_config", type=Path, default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        cmd.add_argument("--repository", dest="sub_repository", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        return cmd


def add_json(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--json", action="store_true", help=JSON_HELP)
