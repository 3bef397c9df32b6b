"""Pure webhook admission: signature, headers, content type and JSON checks over (headers, raw body)."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# Header names as Gitea sends them; the X-GitHub-* copies are the fallback (FACTS.md section 1).
EVENT_HEADERS = ("X-Gitea-Event", "X-GitHub-Event", "X-Gogs-Event")
EVENT_TYPE_HEADERS = ("X-Gitea-Event-Type", "X-GitHub-Event-Type", "X-Gogs-Event-Type")
DELIVERY_HEADERS = ("X-Gitea-Delivery", "X-GitHub-Delivery", "X-Gogs-Delivery")
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
class Delivery:
    """An admitted delivery, ready to be stored: the raw body is kept byte for byte."""

    delivery_id: str
    event: str
    event_type: str | None
    action: str | None
    sender_login: str | None
    body: bytes
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
    candidates = [sig for sig in (gitea_sig, hub_sig) if sig]
    if not candidates:
        return False
    matched = False
    for secret in secrets:
        if not secret:
            continue
        expected = hmac.new(secret, body, hashlib.sha256).hexdigest()
        for sig in candidates:
            # No short-circuit: keep the work the same whether or not an earlier secret matched.
            matched |= hmac.compare_digest(expected, sig)
    return matched


def _is_json_content_type(content_type: str | None) -> bool:
    if not content_type:
        return False
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def admit(
    headers: Mapping[str, str],
    body: bytes,
    *,
    secrets: Sequence[bytes],
    max_body_bytes: int,
) -> Delivery | Rejection:
    """Decide whether a webhook request is admitted, in a fixed order: 413, 415, 401, 400 headers, 400 JSON.

    ``headers`` must be case-insensitive (aiohttp's CIMultiDict is). Nothing here re-serialises the body.
    """
    if len(body) > max_body_bytes:
        return Rejection(413, "payload_too_large", f"body is {len(body)} bytes; the limit is {max_body_bytes}")
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
    if len(delivery_id) > 200 or not delivery_id.isprintable():
        return Rejection(400, "bad_header", "X-Gitea-Delivery is not a printable id of at most 200 characters")
    try:
        payload = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return Rejection(400, "malformed_json", f"body is not valid JSON: {exc}")
    if not isinstance(payload, dict):
        return Rejection(400, "malformed_json", "body is JSON but not an object")
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
        headers={name: headers[name] for name in KEPT_HEADERS if name in headers},
        payload=payload,
    )


def is_self_event(delivery: Delivery, bot_login: str | None) -> bool:
    """Gitea does not filter by actor: the bot's own changes come back as webhooks and are ignored."""
    return bool(bot_login) and delivery.sender_login is not None and (
        delivery.sender_login.lower() == (bot_login or "").lower()
    )
