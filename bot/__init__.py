"""gitea-foreman: the service that governs AI coding agents on a Gitea repository."""
