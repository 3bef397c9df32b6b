"""Consistency invariants across foreman's database, Gitea and the control checkout (docs/operating.md, section 5).

``facts.py`` names the invariants and the facts they read, ``checks.py`` checks the facts (pure), ``gather.py`` reads
them from the database, Gitea and the checkout."""

from __future__ import annotations

from bot.invariants.checks import HANDOVER_REASON, check, report
from bot.invariants.facts import (
    INVARIANTS,
    CheckoutFacts,
    CommentFact,
    DbFacts,
    DeliveryFact,
    Facts,
    GiteaFacts,
    LeaseFact,
    OutboxFact,
    RegistrationFact,
    TeardownFact,
    TransitionFact,
    Violation,
    WorktreeFact,
)
from bot.invariants.gather import GiteaReads, gather, gather_checkout, gather_db, gather_gitea

__all__ = [
    "HANDOVER_REASON",
    "INVARIANTS",
    "CheckoutFacts",
    "CommentFact",
    "DbFacts",
    "DeliveryFact",
    "Facts",
    "GiteaFacts",
    "GiteaReads",
    "LeaseFact",
    "OutboxFact",
    "RegistrationFact",
    "TeardownFact",
    "TransitionFact",
    "Violation",
    "WorktreeFact",
    "check",
    "gather",
    "gather_checkout",
    "gather_db",
    "gather_gitea",
    "report",
]
