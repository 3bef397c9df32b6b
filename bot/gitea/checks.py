"""The merge-check calls of the Gitea client: the repository's branch protection rules and a commit's statuses."""

from __future__ import annotations

import urllib.parse

from bot.gitea.endpoint import MAX_PAGE_SIZE, RepositoryEndpoint
from bot.gitea.values import BranchProtection, CombinedStatus, CommitStatus


class CheckCalls(RepositoryEndpoint):
    """Mixed into ``GiteaClient`` over the shared ``RepositoryEndpoint``."""

    async def list_branch_protections(self) -> list[BranchProtection]:
        """Every branch protection rule of the repository (``GET /repos/{owner}/{repo}/branch_protections``, one
        unpaged list; reading it needs admin on the repository: GiteaForbidden otherwise)."""
        data = await self._call("GET", f"{self._repo_path}/branch_protections")
        return [BranchProtection.from_json(item) for item in data or ()]

    async def combined_status(self, ref: str) -> CombinedStatus:
        """The combined status of ``ref`` (a sha, branch or tag): the latest status of every context, read page by
        page (``GET /repos/{owner}/{repo}/commits/{ref}/status`` lists the contexts paged, with ``total_count``)."""
        path = f"{self._repo_path}/commits/{urllib.parse.quote(ref, safe='')}/status"
        first: CombinedStatus | None = None
        statuses: list[CommitStatus] = []
        seen: set[tuple[int, str]] = set()
        page = 1
        while True:
            data = await self._call("GET", path, query={"page": str(page), "limit": str(MAX_PAGE_SIZE)})
            combined = CombinedStatus.from_json(data or {})
            first = first or combined
            fresh = [s for s in combined.statuses if (s.id, s.context) not in seen]
            statuses.extend(fresh)
            seen.update((s.id, s.context) for s in fresh)
            if len(combined.statuses) < MAX_PAGE_SIZE or not fresh or len(statuses) >= combined.total_count:
                return CombinedStatus(first.sha, first.state, tuple(statuses), max(first.total_count, len(statuses)),
                                      raw=first.raw)
            page += 1
