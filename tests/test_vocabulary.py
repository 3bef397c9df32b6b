"""The workflow vocabulary: one table of STATE values, roles and their status:* labels."""

from __future__ import annotations

import re

import pytest

from bot.core import vocabulary as v
from tests.conftest import SHARED

SEED_850 = SHARED / "seeds" / "004_3bdea2fd42671c60.txt"


def test_vocabulary_has_the_required_states_in_workflow_order() -> None:
    """Issue requirement 3: STATE values include ready, in-progress, pr-open, review, blocked, done."""
    assert [row.state for row in v.STATES] == ["ready", "in-progress", "pr-open", "review", "blocked", "done"]
    assert v.STATE_VALUES == frozenset(row.state for row in v.STATES)


def test_vocabulary_has_exactly_the_five_roles() -> None:
    """Issue requirement 3: WHO_IS_NEXT roles are controller, author, reviewer, merger, human."""
    assert [row.role for row in v.ROLES] == ["controller", "author", "reviewer", "merger", "human"]
    assert v.ROSTER_ROLES == {"controller", "author", "reviewer", "merger"}  # ../shared/DESIGN.md section 2: roster


def test_every_state_is_mirrored_by_its_own_distinct_status_label() -> None:
    """Issue requirement 3: each STATE has one status:* label; labels are distinct and prefixed."""
    labels = [row.label for row in v.STATES]
    assert len(set(labels)) == len(labels)
    for row in v.STATES:
        assert row.label == v.STATUS_LABEL_PREFIX + row.state
        assert v.label_for_state(row.state) == row.label
        assert v.state_for_label(row.label) == row.state
    assert v.status_labels() == tuple(labels)


def test_a_row_whose_label_does_not_mirror_its_state_is_refused() -> None:
    """Issue requirement 3: the label is the state under the status: prefix, never something else."""
    with pytest.raises(ValueError, match="status:ready"):
        v.StateRow("ready", "status:Ready", "typo")


@pytest.mark.needs_shared
def test_every_status_label_the_seed_uses_maps_to_a_state() -> None:
    """Issue requirement 3 ("check the seed"): status:ready and status:pr-open from seed 004 are in the table."""
    seed = SEED_850.read_text(encoding="utf-8")
    used = set(re.findall(r"status:[a-z][a-z-]*", seed))
    assert {"status:ready", "status:pr-open"} <= used
    for label in used:
        assert v.state_for_label(label) is not None, label


def test_lookups_refuse_values_outside_the_vocabulary() -> None:
    """Issue requirement 3: lookups are exact; unknown labels give None, unknown states raise."""
    assert v.state_for_label("type:bug") is None
    assert v.state_for_label("status:unknown") is None
    assert v.state_for_label("status:READY") is None
    assert v.is_status_label("status:unknown") and not v.is_status_label("type:bug")
    with pytest.raises(ValueError, match="allowed: ready, in-progress"):
        v.label_for_state("Ready")
    assert v.is_state("pr-open") and not v.is_state("PR-open")
    assert v.is_role("human") and not v.is_role("Human")


def test_vocabulary_markdown_lists_every_row_in_well_formed_tables() -> None:
    """Issue requirement 3: the docs table is rendered from the same table the parser reads."""
    text = v.vocabulary_markdown()
    for row in v.STATES:
        assert f"| `{row.state}` | `{row.label}` | {row.meaning} |" in text
    for role in v.ROLES:
        assert f"| `{role.role}` |" in text
    table_lines = [line for line in text.splitlines() if line]
    assert all(line.startswith("| ") and line.endswith(" |") and line.count(" | ") == 2 for line in table_lines)
    assert text == v.vocabulary_markdown()
