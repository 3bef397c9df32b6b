"""The environment and command-line configuration of every git command foreman runs: hardened, no prompt."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def git_env(bot_login: str) -> dict[str, str]:
    """The environment of every git call: no prompts, and an identity for the reflog entries git writes."""
    return {
        "GIT_TERMINAL_PROMPT": "0",
        "GIT_ASKPASS": "",
        "SSH_ASKPASS": "",
        "GIT_COMMITTER_NAME": bot_login or "foreman",
        "GIT_COMMITTER_EMAIL": f"{bot_login or 'foreman'}@foreman.invalid",
        "GIT_AUTHOR_NAME": bot_login or "foreman",
        "GIT_AUTHOR_EMAIL": f"{bot_login or 'foreman'}@foreman.invalid",
    }


#: Configuration every git command foreman runs gets on its command line, which overrides every file git reads. Nothing
#: a configuration names runs (an fsmonitor, hooks, an askpass or credential helper, ssh, a pager or editor), the
#: attribute and ignore files of the user running foreman are not read, no submodule is entered, and no transport
#: but file and HTTP(S) is used. What cannot be listed here (a filter or textconv driver, ``diff.<driver>.command``,
#: ``diff.external``, whose empty value git would try to run, ``include.path``) comes only from the repository's own
#: ``.git/config`` (``hardened_env``); the commands that diff say ``--no-ext-diff --no-textconv`` too.
NEUTRAL_CONFIG: tuple[tuple[str, str], ...] = (
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.attributesFile", "/dev/null"),
    ("core.excludesFile", "/dev/null"),
    ("core.askPass", ""),
    ("core.sshCommand", "false"),
    ("core.pager", "cat"),
    ("core.editor", ":"),
    ("credential.helper", ""),
    ("submodule.recurse", "false"),
    ("commit.gpgSign", "false"),
    ("protocol.allow", "never"),
    ("protocol.file.allow", "always"),
    ("protocol.http.allow", "always"),
    ("protocol.https.allow", "always"),
)
#: The variables of foreman's own environment git may see among the ``GIT_*`` ones: TLS, HTTP and tracing settings
#: an operator gives git. Every other ``GIT_*`` variable (one naming a repository, an index, object directories,
#: configuration, a program to run) is dropped: git's whole environment is foreman's choice.
_KEPT_GIT_VARIABLES = ("GIT_SSL_", "GIT_HTTP_", "GIT_CURL_", "GIT_TRACE", "GIT_REDACT_COOKIES")


def config_args() -> list[str]:
    """``-c key=value`` for each of ``NEUTRAL_CONFIG``."""
    return [item for key, value in NEUTRAL_CONFIG for item in ("-c", f"{key}={value}")]


def hardened_env(env: Mapping[str, str], *, git_dir: Path | None = None,
                 work_tree: Path | None = None) -> dict[str, str]:
    """The whole environment of one git command: foreman's own without its ``GIT_*`` variables (but
    ``_KEPT_GIT_VARIABLES``), then ``env``, then what no caller overrides: no system or global configuration
    (``GIT_CONFIG_NOSYSTEM``, ``GIT_CONFIG_GLOBAL=/dev/null``), no system attributes, no prompt, git's messages in
    English (foreman reads some of them), and the repository when given (``GIT_DIR``, ``GIT_WORK_TREE``: git finds
    nothing by itself then, so a ``.git`` file git would otherwise follow is never read)."""
    full = {key: value for key, value in os.environ.items()
            if not key.startswith("GIT_") or key.startswith(_KEPT_GIT_VARIABLES)}
    full.pop("SSH_ASKPASS", None)
    full.update(env)
    full.update({
        "LC_ALL": "C", "LANGUAGE": "C",
        "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_ATTR_NOSYSTEM": "1",
        "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": "", "GIT_EDITOR": ":", "GIT_PAGER": "cat",
    })
    if git_dir is not None:
        full["GIT_DIR"] = str(git_dir)
    if work_tree is not None:
        full["GIT_WORK_TREE"] = str(work_tree)
    return full
