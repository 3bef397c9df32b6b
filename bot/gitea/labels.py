"""The label calls of the Gitea client: an issue's labels, the repository's and the organization's."""

from __future__ import annotations

from collections.abc import Sequence

from bot.gitea.endpoint import MAX_PAGE_SIZE, RepositoryEndpoint, quote_segment
from bot.gitea.errors import GiteaInvalid
from bot.gitea.transport import LAST_HEADERS
from bot.gitea.values import Label


def label_refs(labels: Sequence[int] | Sequence[str], method: str, path: str) -> list[int] | list[str]:
    """Gitea wants all label ids or all names; a mix (or anything else) is refused before sending."""
    if isinstance(labels, str | bytes):
        raise GiteaInvalid("labels must be a sequence of ids or names, not one string", method=method, path=path)
    items = list(labels)
    ids = [x for x in items if isinstance(x, int) and not isinstance(x, bool)]
    names = [x for x in items if isinstance(x, str)]
    if (ids and names) or len(ids) + len(names) != len(items):
        raise GiteaInvalid("labels must be all integer ids or all string names", method=method, path=path)
    return ids if ids else names


class LabelCalls(RepositoryEndpoint):
    """Mixed into ``GiteaClient`` over the shared ``RepositoryEndpoint``."""

    async def list_issue_labels(self, number: int) -> list[Label]:
        """The labels on an issue."""
        data = await self._call("GET", f"{self._repo_path}/issues/{int(number)}/labels")
        return [Label.from_json(item) for item in data or ()]

    async def add_labels(self, number: int, labels: Sequence[int] | Sequence[str]) -> list[Label]:
        """Add labels (all ids or all names; unknown names are ignored); returns the full list after."""
        path = f"{self._repo_path}/issues/{int(number)}/labels"
        data = await self._call("POST", path, data={"labels": label_refs(labels, "POST", path)})
        return [Label.from_json(item) for item in data or ()]

    async def replace_labels(self, number: int, labels: Sequence[int] | Sequence[str]) -> list[Label]:
        """Replace the labels (all ids or all names); returns the full list after."""
        path = f"{self._repo_path}/issues/{int(number)}/labels"
        data = await self._call("PUT", path, data={"labels": label_refs(labels, "PUT", path)})
        return [Label.from_json(item) for item in data or ()]

    async def remove_label(self, number: int, label_id: int) -> None:
        """Remove one label by id (Gitea has no remove-by-name); GiteaInvalid when the label is unknown."""
        await self._call("DELETE", f"{self._repo_path}/issues/{int(number)}/labels/{int(label_id)}")

    async def clear_labels(self, number: int) -> None:
        """Remove every label (sends ``label_cleared``)."""
        await self._call("DELETE", f"{self._repo_path}/issues/{int(number)}/labels")

    async def list_repo_labels(self, *, page_size: int = MAX_PAGE_SIZE) -> list[Label]:
        """Every repository label. Gitea sends no Link header here: page until a short or empty page,
        or until ``X-Total-Count`` labels were read."""
        path = f"{self._repo_path}/labels"
        size = max(1, min(page_size, MAX_PAGE_SIZE))
        labels: list[Label] = []
        page = 1
        while True:
            LAST_HEADERS.set(None)
            data = await self._call("GET", path, query={"page": page, "limit": size})
            items = list(data or ())
            labels.extend(Label.from_json(item) for item in items)
            headers = LAST_HEADERS.get()
            total = headers.get("X-Total-Count") if headers is not None else None
            if not items:
                break
            if total is not None and total.isdigit():
                if len(labels) >= int(total):
                    break
            elif len(items) < size:
                break
            page += 1
        return labels

    async def list_org_labels(self, org: str, *, page_size: int = MAX_PAGE_SIZE) -> list[Label]:
        """Every label of organization ``org`` (``GET /orgs/{org}/labels``: X-Total-Count, no Link header);
        GiteaNotFound when ``org`` is no organization."""
        path = f"/orgs/{quote_segment(org)}/labels"
        size = max(1, min(page_size, MAX_PAGE_SIZE))
        labels: list[Label] = []
        page = 1
        while True:
            LAST_HEADERS.set(None)
            items = list(await self._call("GET", path, query={"page": page, "limit": size}) or ())
            labels.extend(Label.from_json(item) for item in items)
            headers = LAST_HEADERS.get()
            total = headers.get("X-Total-Count") if headers is not None else None
            if not items or (total is not None and total.isdigit() and len(labels) >= int(total)):
                break
            if total is None and len(items) < size:
                break
            page += 1
        return labels

    async def create_label(self, name: str, *, color: str, description: str = "", exclusive: bool = False) -> Label:
        """Create a repository label (``color`` as ``#rrggbb`` or ``rrggbb``)."""
        data = {"name": name, "color": color, "description": description, "exclusive": exclusive}
        return Label.from_json(await self._call("POST", f"{self._repo_path}/labels", data=data))
