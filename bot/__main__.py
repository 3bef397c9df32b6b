"""`python -m bot` is the same as the `foreman` command (its console entry point is :func:`main`)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """`foreman`: ``mcp --url URL`` (or ``mcp`` with ``FOREMAN_MCP_URL``) runs the stdio bridge without loading the
    service (no config, no database, none of its packages); every other command line goes to :mod:`bot.cli`."""
    args = sys.argv[1:] if argv is None else list(argv)
    from bot.mcp_bridge import wants_bridge

    if wants_bridge(args, os.environ):
        from bot.mcp_bridge import main as bridge_main

        return bridge_main(args)
    from bot.cli import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
