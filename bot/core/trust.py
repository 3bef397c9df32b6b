"""Who may set an issue's state: the pure reading of what Gitea reports about permissions and teams."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

#: Access modes that may write on the Issues unit (``AccessMode.ToString``).
WRITE_MODES: Final = frozenset({"write", "admin", "owner"})
ISSUES_UNIT: Final = "repo.issues"


@dataclass(frozen=True, slots=True)
class TeamGrant:
    """A team as the team API reports it: id, name, access mode and per-unit modes."""

    id: int
    name: str
    permission: str
    units_map: Mapping[str, str]

    @property
    def issues_mode(self) -> str:
        """The team's mode on Issues (``Team.UnitAccessMode``: admin/owner teams have it on every unit)."""
        if self.permission in ("admin", "owner"):
            return self.permission
        return self.units_map.get(ISSUES_UNIT, "none")


def permission_trusts(permission: str) -> bool:
    """The permission API's mode alone is enough (direct collaborators, write/admin teams, owners)."""
    return permission in WRITE_MODES


def issue_writing_teams(teams: Iterable[TeamGrant]) -> list[TeamGrant]:
    """The teams whose members may write on Issues, by name (membership is asked only for these)."""
    return sorted((t for t in teams if t.issues_mode in WRITE_MODES), key=lambda t: (t.name.lower(), t.id))


def team_reason(team: TeamGrant) -> str:
    """The trust reason of a member of ``team``."""
    return f"team:{team.name}:{ISSUES_UNIT}={team.issues_mode}"


def unseen_membership_reason(permission: str, teams: Iterable[TeamGrant]) -> str:
    """Why a ``read`` person stays untrusted when the bot cannot see team membership for certain."""
    grants = ", ".join(f"{t.name} grants {ISSUES_UNIT}={t.issues_mode}" for t in teams)
    return (
        f"permission:{permission}; team {grants}, but the bot cannot read team membership for certain "
        "(it must be an org owner, a site admin or a member of the team, with a read:organization token)"
    )
