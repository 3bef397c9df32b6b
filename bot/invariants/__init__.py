"""Consistency invariants across foreman's database, Gitea and the control checkout (docs/operating.md, section 5).

``facts.py`` names the invariants and the facts they read, ``checks.py`` checks the facts (pure), ``gather.py`` reads
them from the database, Gitea and the checkout."""

from __future__ import annotations

from bot.invariants.checks import check, report
from bot.invariants.facts import INVARIANTS, Facts, Violation
from bot.invariants.gather import gather, gather_checkout, gather_db, gather_gitea, gather_queues

__all__ = [
    "INVARIANTS", "Facts", "Violation", "check", "gather", "gather_checkout", "gather_db",
    "gather_gitea", "gather_queues", "report",
]
