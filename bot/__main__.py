"""`python -m bot` is the same as the `foreman` command."""

from bot.cli import main

raise SystemExit(main())
