"""Pure webhook admission: signature, headers, content type and JSON checks over (headers, raw body)."""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bot.core.jsontext import UNSURE, JSONTextError, may_hold_long_integer, quick_loads, strict_loads
from bot.core.vocabulary import MAX_ISSUE_NUMBER, is_issue_number

# Header names as Gitea sends them; the X-GitHub-* copies are the fallback (../shared/gitea/FACTS.md section 1).
EVENT_HEADERS = ("X-Gitea-Event", "X-GitHub-Event", "X-Gogs-Event")
EVENT_TYPE_HEADERS = ("X-Gitea-Event-Type", "X-GitHub-Event-Type", "X-Gogs-Event-Type")
DELIVERY_HEADERS = ("X-Gitea-Delivery", "X-GitHub-Delivery", "X-Gogs-Delivery")
# Every coarse event name Gitea 1.22-1.26 sends (../shared/gitea/FACTS.md section 2, modules/webhook/type.go).
# Metric labels take only these (or "other"), so no request, signed or not, can mint a new time series.
KNOWN_EVENTS = frozenset(
    {
        "create", "delete", "fork", "push", "issues", "issue_assign", "issue_label", "issue_milestone",
        "issue_comment", "pull_request", "pull_request_assign", "pull_request_label", "pull_request_milestone",
        "pull_request_comment", "pull_request_approved", "pull_request_rejected", "pull_request_sync",
        "pull_request_review_request", "wiki", "repository", "release", "package", "status", "workflow_job",
        "workflow_run",
    }
)


def metric_event(event: str | None) -> str:
    """The ``event`` label for a delivery's metrics: a known Gitea event name, else ``other``."""
    return event if event in KNOWN_EVENTS else "other"


# Headers worth keeping with a stored delivery (nothing secret: no Authorization).
KEPT_HEADERS = (
    *EVENT_HEADERS,
    *EVENT_TYPE_HEADERS,
    *DELIVERY_HEADERS,
    "X-Gitea-Hook-Installation-Target-Type",
    "Content-Type",
    "User-Agent",
)


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a request was refused: the HTTP status and a JSON error body for the sender."""

    status: int
    error: str
    message: str

    def body(self) -> dict[str, str]:
        return {"error": self.error, "message": self.message}


@dataclass(frozen=True, slots=True)
class WebhookDelivery:
    """A webhook delivery as Gitea sent it: its id, event, type, action, sender and raw body (byte for byte)."""

    delivery_id: str
    event: str
    event_type: str | None
    action: str | None
    sender_login: str | None
    body: bytes


@dataclass(frozen=True, slots=True)
class Delivery(WebhookDelivery):
    """An admitted delivery, ready to be stored: the raw body is kept byte for byte."""

    body_sha256: str
    headers: dict[str, str]
    payload: Any


def _first_header(headers: Mapping[str, str], names: Sequence[str]) -> str | None:
    for name in names:
        value = headers.get(name)
        if value:
            return value.strip()
    return None


def signature_matches(secrets: Sequence[bytes], body: bytes, headers: Mapping[str, str]) -> bool:
    """True if X-Gitea-Signature (hex) or X-Hub-Signature-256 (sha256=hex) matches any secret.

    Every secret is tried with a constant-time compare, so timing says nothing about which one matched.
    """
    gitea_sig = (headers.get("X-Gitea-Signature") or "").strip().lower()
    hub_sig = (headers.get("X-Hub-Signature-256") or "").strip()
    if hub_sig.lower().startswith("sha256="):
        hub_sig = hub_sig[len("sha256=") :].lower()
    else:
        hub_sig = ""
    # Compared as bytes: compare_digest refuses non-ASCII str, and a header may carry any byte (aiohttp
    # decodes header bytes with surrogateescape), which must be a mismatch, never an exception.
    candidates = [sig.encode("utf-8", "surrogateescape") for sig in (gitea_sig, hub_sig) if sig]
    if not candidates:
        return False
    matched = False
    for secret in secrets:
        if not secret:
            continue
        expected = hmac.new(secret, body, hashlib.sha256).hexdigest().encode("ascii")
        for sig in candidates:
            # No short-circuit: keep the work the same whether or not an earlier secret matched.
            matched |= hmac.compare_digest(expected, sig)
    return matched


def _is_json_content_type(content_type: str | None) -> bool:
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def content_encoding_refusal(headers: Mapping[str, str]) -> Rejection | None:
    """Gitea never compresses a delivery; a body that claims a coding is refused before it is read (415)."""
    coding = (headers.get("Content-Encoding") or "identity").strip().lower()
    if coding == "identity":
        return None
    return Rejection(
        415,
        "unsupported_media_type",
        "Content-Encoding is not supported: send the JSON body uncompressed, as Gitea does",
    )


def admit(
    headers: Mapping[str, str],
    body: bytes,
    *,
    secrets: Sequence[bytes],
    max_body_bytes: int,
) -> Delivery | Rejection:
    """Decide whether a webhook request is admitted, in a fixed order: 413, 415, 401, 400 headers, 400 JSON
    (syntax, lone surrogates, integers outside 64 bits, an issue or pull request number or comment id that is not
    1 to 2^63-1: the handlers would fail on each at every retry and park the delivery ``failed``).

    ``headers`` must be case-insensitive (aiohttp's CIMultiDict is). Nothing here re-serialises the body.
    """
    if len(body) > max_body_bytes:
        return Rejection(413, "payload_too_large", f"body is {len(body)} bytes; the limit is {max_body_bytes}")
    encoding_refusal = content_encoding_refusal(headers)
    if encoding_refusal is not None:
        return encoding_refusal
    content_type = headers.get("Content-Type")
    if not _is_json_content_type(content_type):
        return Rejection(
            415,
            "unsupported_media_type",
            f"content type {content_type or '(none)'} is not JSON: set the Gitea webhook's "
            "'POST Content Type' to application/json (Gitea signs the JSON, so form bodies never verify)",
        )
    if not signature_matches(secrets, body, headers):
        return Rejection(
            401,
            "bad_signature",
            "missing or invalid X-Gitea-Signature / X-Hub-Signature-256: verify that the webhook "
            "secret in Gitea matches one of the configured webhook.secrets",
        )
    event = _first_header(headers, EVENT_HEADERS)
    delivery_id = _first_header(headers, DELIVERY_HEADERS)
    missing = [name for name, value in (("X-Gitea-Event", event), ("X-Gitea-Delivery", delivery_id)) if not value]
    if event is None or delivery_id is None:
        return Rejection(400, "missing_header", f"missing header(s): {', '.join(missing)}")
    if not _EVENT_NAME.fullmatch(event):
        return Rejection(400, "bad_header", "X-Gitea-Event is not a Gitea event name (lower-case letters and _)")
    if len(delivery_id) > 200 or not _is_clean_text(delivery_id):
        return Rejection(400, "bad_header", "X-Gitea-Delivery is not a printable id of at most 200 characters")
    kept = {name: headers[name] for name in KEPT_HEADERS if name in headers}
    unclean = sorted(name for name, value in kept.items() if not _is_clean_text(value))
    if unclean:
        return Rejection(400, "bad_header", f"header(s) {', '.join(unclean)} are not printable UTF-8 text")
    payload = _parse_json(body)
    if isinstance(payload, Rejection):
        return payload
    action = payload.get("action")
    sender = payload.get("sender")
    sender_login = sender.get("login") if isinstance(sender, dict) else None
    return Delivery(
        delivery_id=delivery_id,
        event=event,
        event_type=_first_header(headers, EVENT_TYPE_HEADERS),
        action=action if isinstance(action, str) else None,
        sender_login=sender_login if isinstance(sender_login, str) else None,
        body=body,
        body_sha256=hashlib.sha256(body).hexdigest(),
        headers=kept,
        payload=payload,
    )


#: Bounds on a body's JSON structure (commas + colons, and opening brackets), counted in the raw bytes.
MAX_JSON_SEPARATORS = 100_000
MAX_JSON_CONTAINERS = 20_000
# Gitea's coarse event names are lower-case words joined by '_' (../shared/gitea/FACTS.md section 2).
_EVENT_NAME = re.compile(r"[a-z][a-z_]{0,63}")
# A \uD800-\uDFFF escape in the raw JSON; only a body that has one is searched for lone surrogates.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _is_clean_text(value: str) -> bool:
    """Printable and encodable as UTF-8 (no lone surrogates from undecodable header bytes)."""
    if not value.isprintable():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _parse_json(body: bytes) -> dict[str, Any] | Rejection:
    """The body as a JSON object, or why not. Every way ``json.loads`` can fail is a 400, never a 500:
    bad syntax or encoding, NaN/Infinity, integers past Python's digit limit, nesting past the recursion
    limit, and strings holding a lone surrogate (Gitea's encoder never writes one; SQLite cannot store it)."""
    # Parsing runs on the event loop, and its cost follows the number of values, not the bytes: 5 MB of `[],`
    # takes ~0.5 s. Counting separators is C-speed (~1 ms for 5 MB) and bounds parse + surrogate walk at
    # ~20 ms; Gitea's deliveries use a few hundred (a push of 100 commits a few thousand).
    # A body no longer than the separators' bound cannot exceed it: they are counted only when they could (or
    # when the brackets already refuse the body, for the message).
    containers = body.count(b"{") + body.count(b"[")
    over = containers > MAX_JSON_CONTAINERS or len(body) > MAX_JSON_SEPARATORS
    separators = body.count(b",") + body.count(b":") if over else 0
    if separators > MAX_JSON_SEPARATORS or containers > MAX_JSON_CONTAINERS:
        return Rejection(
            413,
            "payload_too_complex",
            f"body has {separators} separators and {containers} brackets; the limits are {MAX_JSON_SEPARATORS} "
            f"and {MAX_JSON_CONTAINERS}, far above any Gitea delivery",
        )
    payload = quick_loads(body, containers=containers)
    if payload is UNSURE:
        try:
            payload = strict_loads(body, object_pairs_hook=None)  # repeated keys: the last wins, as before
        except JSONTextError as exc:
            return Rejection(400, "malformed_json", f"body is not valid JSON: {exc}")
    if not isinstance(payload, dict):
        return Rejection(400, "malformed_json", "body is JSON but not an object")
    # Each walk only when the raw bytes say it could find something (C-speed checks): Gitea's bodies never need one.
    strings, integers = bool(_SURROGATE_ESCAPE.search(body)), may_hold_long_integer(body)
    if strings or integers:
        found = _unstorable(payload, strings=strings, integers=integers)
        if found == "surrogate":
            return Rejection(400, "malformed_json", "body holds a string with a lone UTF-16 surrogate")
        if found == "integer":
            return Rejection(
                400, "invalid_number",
                f"body holds an integer outside 64 bits ({-MAX_ISSUE_NUMBER - 1} to {MAX_ISSUE_NUMBER}); Gitea's "
                "numbers and ids never are",
            )
    return _numbers_refusal(payload) or payload


#: Where a delivery names its issue or pull request (Gitea's ``number``: the index, from 1), and the comment id a
#: command is claimed by. Present, each must be a positive 64-bit integer: the handlers store and look up by them.
_NUMBERED: tuple[tuple[str, ...], ...] = (("number",), ("issue", "number"), ("pull_request", "number"),
                                          ("comment", "id"))


def _numbers_refusal(payload: dict[str, Any]) -> Rejection | None:
    """A 400 for an issue or pull request number (or comment id) that is not 1 to 2^63-1, else None."""
    for path in _NUMBERED:
        container: Any = payload
        for key in path[:-1]:
            container = container.get(key) if isinstance(container, dict) else None
        if not isinstance(container, dict) or path[-1] not in container:
            continue
        value = container[path[-1]]
        if not is_issue_number(value):
            shown = repr(value) if not isinstance(value, str | list | dict) else type(value).__name__
            return Rejection(
                400, "invalid_number",
                f"{'.'.join(path)} is {shown[:40]}, not an integer from 1 to {MAX_ISSUE_NUMBER} as Gitea sends it",
            )
    return None


def _unstorable(payload: object, *, strings: bool, integers: bool) -> str | None:
    """``"surrogate"`` for a string (or key) holding a lone surrogate, ``"integer"`` for an integer outside 64 bits
    (SQLite and PostgreSQL cannot store either), else None. Walks the parsed payload without recursion (its depth
    is attacker-chosen)."""
    low, high = -MAX_ISSUE_NUMBER - 1, MAX_ISSUE_NUMBER
    stack: list[object] = [payload]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            texts: list[str] = [item]
        elif isinstance(item, dict):
            texts = [key for key in item if isinstance(key, str)]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
            continue
        elif integers and type(item) is int and not low <= item <= high:
            return "integer"
        else:
            continue
        if strings:
            for text in texts:
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:
                    return "surrogate"
    return None


def is_self_event(delivery: Delivery, bot_login: str | None) -> bool:
    """Gitea does not filter by actor: the bot's own changes come back as webhooks and are ignored, except a pull
    request's close: a merge foreman posted with the bot's token ends the issue's life like anyone's (the
    teardown happens once per pull request, and writes nothing that closes a pull request again)."""
    if delivery.event == "pull_request" and delivery.action == "closed":
        return False
    return bool(bot_login) and delivery.sender_login is not None and (
        delivery.sender_login.lower() == (bot_login or "").lower()
    )
