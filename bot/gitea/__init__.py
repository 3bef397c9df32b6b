"""The Gitea REST client: its errors, its values and the client itself."""

from bot.gitea.client import Acting, GiteaClient, client_as, client_for
from bot.gitea.endpoint import MAX_PAGE_SIZE, IssueState
from bot.gitea.errors import (
    GiteaConflict,
    GiteaError,
    GiteaForbidden,
    GiteaInvalid,
    GiteaIssueGone,
    GiteaNotFound,
    GiteaUnassignable,
    GiteaUnavailable,
    refusal_text,
)
from bot.gitea.issues import IssueType
from bot.gitea.transport import next_page
from bot.gitea.values import (
    Branch,
    BranchProtection,
    ChangedFile,
    CombinedStatus,
    Comment,
    CommitStatus,
    Hook,
    Issue,
    Label,
    PullRequest,
    Repository,
    Review,
    ReviewComment,
    Team,
    User,
)

__all__ = [
    "MAX_PAGE_SIZE",
    "Acting",
    "Branch",
    "BranchProtection",
    "ChangedFile",
    "CombinedStatus",
    "Comment",
    "CommitStatus",
    "GiteaClient",
    "GiteaConflict",
    "GiteaError",
    "GiteaForbidden",
    "GiteaInvalid",
    "GiteaIssueGone",
    "GiteaNotFound",
    "GiteaUnassignable",
    "GiteaUnavailable",
    "Hook",
    "Issue",
    "IssueState",
    "IssueType",
    "Label",
    "PullRequest",
    "Repository",
    "Review",
    "ReviewComment",
    "Team",
    "User",
    "client_as",
    "client_for",
    "next_page",
    "refusal_text",
]
