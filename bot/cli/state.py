"""`foreman state parse`: Canonical Issue State blocks to JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bot.cli.common import EXIT_USAGE, emit
from bot.cli.parsing import Commands
from bot.config import Settings


def cmd_state_parse(settings: Settings | None, args: argparse.Namespace) -> int:
    from bot.core.canonical import state_parse_report

    if args.file in (None, "-"):
        text = sys.stdin.read()
    else:
        try:
            text = Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            emit(
                {
                    "error": "invalid_input",
                    "message": f"cannot read {args.file}: {why}",
                    "remediate": "Give a readable UTF-8 file, or - to read standard input.",
                    "exact_next_action": "run foreman state parse FILE with a readable file",
                },
                as_json=True,
            )
            return EXIT_USAGE
    code, doc = state_parse_report(text)
    print(json.dumps(doc, indent=2, sort_keys=True))
    return int(code)


def register(commands: Commands) -> None:
    """``foreman state`` (``state parse``)."""
    state = commands.add("state", "Canonical Issue State tools")
    state_sub = state.add_subparsers(dest="state_command", required=True, metavar="SUBCOMMAND")
    parse = state_sub.add_parser("parse", help="parse Canonical Issue State block(s) to JSON")
    parse.add_argument("file", nargs="?", help="a file, or - for standard input (default)")
