"""Server-rendered HTML for the dashboard: small functions over the view model, every value escaped; the one script
(the page's own refresh) is a constant that runs under the response's CSP nonce."""

from __future__ import annotations

import html
import json
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

Row = Mapping[str, Any]

_STYLE = """
:root{color-scheme:light dark;--b:#8884;--ok:#2a7d2a;--bad:#b3261e;--warn:#9a6700}
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:72rem;padding:.75rem}
h1{font-size:1.3rem;margin:.2rem 0}h2{font-size:1.1rem;margin:1.4rem 0 .4rem;border-bottom:1px solid var(--b)}
h3{font-size:1rem;margin:.8rem 0 .3rem}
nav a{margin-right:.8rem;white-space:nowrap;display:inline-block}
.scroll{overflow-x:auto;-webkit-overflow-scrolling:touch}
table{border-collapse:collapse;width:100%;font-size:.9rem}
th,td{border-bottom:1px solid var(--b);padding:.3rem .4rem;text-align:left;vertical-align:top}
th{white-space:nowrap}
td.wrap{overflow-wrap:break-word;max-width:28rem}
code,pre{font:.85rem ui-monospace,SFMono-Regular,Menlo,monospace;overflow-wrap:anywhere}
h1,h2,h3,p{overflow-wrap:anywhere}
pre{white-space:pre-wrap;word-break:break-word;margin:0;max-height:16rem;overflow:auto}
.muted{opacity:.7}.empty{opacity:.7;font-style:italic}
.tag{display:inline-block;border:1px solid var(--b);border-radius:.6rem;padding:0 .4rem;margin:0 .15rem .1rem 0;
     font-size:.8rem;white-space:nowrap}
.ok{color:var(--ok)}.bad{color:var(--bad)}.warn{color:var(--warn)}
.versions{display:grid;grid-template-columns:1fr 1fr;gap:.4rem}
.health{display:flex;flex-wrap:wrap;gap:.4rem;margin:.3rem 0}
.check{border:1px solid var(--b);border-radius:.4rem;padding:.25rem .5rem;flex:1 1 14rem;min-width:0}
.check b{display:block;font-size:.8rem}.check.ok{border-color:var(--ok)}.check.bad{border-color:var(--bad)}
.check.warn{border-color:var(--warn)}.check span{color:CanvasText;font-size:.85rem;overflow-wrap:anywhere}
.banner{padding:.5rem .7rem;border-radius:.4rem;font-weight:600;margin:.4rem 0;overflow-wrap:anywhere}
.banner.ok{background:#2a7d2a22;border:1px solid var(--ok)}.banner.bad{background:#b3261e22;border:1px solid var(--bad)}
.banner.warn{background:#9a670022;border:1px solid var(--warn)}
.board{display:grid;grid-template-columns:repeat(auto-fit,minmax(13rem,1fr));gap:.5rem;align-items:start}
.col{border:1px solid var(--b);border-radius:.4rem;padding:.3rem;min-width:0}
.col h3{margin:.1rem .2rem .3rem;font-size:.95rem}
.card{border:1px solid var(--b);border-radius:.35rem;padding:.3rem .4rem;margin:.3rem 0;font-size:.85rem;
      overflow-wrap:anywhere}
.card .t{font-weight:600}.card dl{margin:.2rem 0 0;display:grid;grid-template-columns:auto 1fr;gap:0 .4rem}
.card dt{opacity:.7}.card dd{margin:0;min-width:0}
ul.needs{margin:.2rem 0;padding-left:1.2rem}ul.needs li{margin:.15rem 0;overflow-wrap:anywhere}
.count{font-weight:600}
@media (max-width:40rem){body{font-size:14px;padding:.5rem}.versions{grid-template-columns:1fr}
  .scroll table{min-width:46rem}td.wrap{max-width:18rem}}
"""

_STATUS_CLASS = {
    "done": "ok", "completed": "ok", "live": "ok", "admitted": "ok", "intact": "ok", "select": "ok",
    "failed": "bad", "verification_failed": "bad", "parked": "bad", "compensated": "bad", "denied": "bad",
    "invalid": "bad", "blocked": "bad", "expired": "warn", "pending": "warn", "queued": "warn", "sending": "warn",
    "processing": "warn", "ignored": "muted", "ignored_self": "muted", "released": "muted", "wait": "warn",
}


#: The moment the page being rendered describes (its document's ``generated_at``): relative times count from it.
_NOW: ContextVar[datetime | None] = ContextVar("dashboard_now", default=None)


def _moment(value: object) -> datetime | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return datetime.fromtimestamp(value, UTC)
    if not isinstance(value, str) or not value:
        return None
    try:
        found = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return found if found.tzinfo is not None else found.replace(tzinfo=UTC)


def span(seconds: object) -> str:
    """A duration in words, to the unit that matters (``42 s``, ``5 min``, ``3 h 10 min``, ``2 d 4 h``)."""
    if not isinstance(seconds, (int, float)) or isinstance(seconds, bool):
        return "-"
    total = int(abs(seconds))
    if total < 60:
        return f"{total} s"
    if total < 3600:
        return f"{total // 60} min"
    if total < 86400:
        return f"{total // 3600} h {total % 3600 // 60} min"
    return f"{total // 86400} d {total % 86400 // 3600} h"


def when(value: object) -> str:
    """A stored time as relative text (``5 min ago``) with the absolute UTC time, to the second, on hover."""
    moment = _moment(value)
    if moment is None:
        return e(value)
    absolute = moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    now = _NOW.get()
    if now is None:
        shown = absolute
    else:
        delta = (now - moment).total_seconds()
        shown = "just now" if abs(delta) < 5 else f"{span(delta)} ago" if delta > 0 else f"in {span(delta)}"
    iso = moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f'<time datetime="{iso}" title="{absolute}">{e(shown)}</time>'


def timed(key: str) -> Callable[[Mapping[str, Any]], str]:
    return lambda row: when(row.get(key))


def e(value: object) -> str:
    """Any value as escaped text (None as a dash)."""
    return "-" if value is None or value == "" else html.escape(str(value), quote=True)


def status(value: object) -> str:
    cls = _STATUS_CLASS.get(str(value), "")
    return f'<span class="tag {cls}">{e(value)}</span>'


def tags(values: Iterable[object]) -> str:
    out = "".join(f'<span class="tag">{e(v)}</span>' for v in values)
    return out or '<span class="muted">-</span>'


def as_json(value: object) -> str:
    return f"<pre>{e(json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str))}</pre>"


#: The query every issue link of the page being rendered carries: ``?repository=<key>`` when the service serves
#: several repositories (set by ``overview_page`` and ``issue_page`` from their document), else nothing.
_LINK_QUERY: ContextVar[str] = ContextVar("dashboard_link_query", default="")


def _link_query(doc: Row) -> str:
    served = doc.get("repositories") or []
    selected = next((r.get("key") for r in served if r.get("selected")), None)
    return f"?{urllib.parse.urlencode({'repository': selected})}" if len(served) > 1 and selected else ""


def issue_link(number: object) -> str:
    if isinstance(number, int) and not isinstance(number, bool) and number > 0:
        return f'<a href="/dashboard/issues/{number}{html.escape(_LINK_QUERY.get(), quote=True)}">#{number}</a>'
    return e(number)


def table(rows: Sequence[Row], columns: Sequence[tuple[str, Callable[[Row], str]]], *, empty: str,
          test_id: str = "") -> str:
    if not rows:
        return f'<p class="empty">{e(empty)}</p>'
    head = "".join(f"<th>{e(name)}</th>" for name, _ in columns)
    body = "".join("<tr>" + "".join(f'<td class="wrap">{cell(row)}</td>' for _, cell in columns) + "</tr>"
                   for row in rows)
    attr = f' data-test="{e(test_id)}"' if test_id else ""
    return f'<div class="scroll"><table{attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def field(key: str) -> Callable[[Row], str]:
    return lambda row: e(row.get(key))


#: Keeps the reader's place across the page's own refresh (``page``'s ``refresh_s``): runs under the CSP's nonce.
_REFRESH = (
    "(function(){var k='foreman-scroll:'+location.pathname+location.search,y=sessionStorage.getItem(k);"
    "if(y!==null){sessionStorage.removeItem(k);window.scrollTo(0,+y);}"
    "var s=+document.body.getAttribute('data-refresh');if(s>0){setTimeout(function(){"
    "sessionStorage.setItem(k,String(window.scrollY));location.reload();},s*1000);}})();"
)


def page(title: str, body: str, *, nav: Sequence[tuple[str, str]] = (), nonce: str | None = None,
         refresh_s: int = 0) -> str:
    """A whole page; with a ``nonce`` (the response's CSP allows scripts carrying it) it reloads itself every
    ``refresh_s`` seconds where the reader was on it."""
    links = "".join(f'<a href="{e(href)}">{e(text)}</a>' for href, text in nav)
    script = f'<script nonce="{e(nonce)}">{_REFRESH}</script>' if nonce and refresh_s > 0 else ""
    refresh = f' data-refresh="{int(refresh_s)}"' if nonce and refresh_s > 0 else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width,initial-scale=1">'
        '<meta name=referrer content=no-referrer>'
        f"<title>{e(title)}</title><style>{_STYLE}</style></head><body{refresh}>"
        f"<header><h1>{e(title)}</h1><nav>{links}</nav></header><main>{body}</main>"
        '<footer class="muted"><p>Read-only'
        + (f", refreshed every {int(refresh_s)} s" if refresh else "")
        + '. The same data as JSON: <a href="/dashboard/api/overview">'
        f"/dashboard/api/overview</a>.</p></footer>{script}</body></html>"
    )


# --- the front page ---------------------------------------------------------------------------------------------------
_NAV = (("#health", "Health"), ("#needs", "Needs a person"), ("#board", "Board"), ("#refused", "Refused"),
        ("#repositories", "Repositories"), ("#allocator", "Allocator"), ("#queues", "Queues"), ("#leases", "Leases"),
        ("#bootstrap", "Bootstrap"), ("#outbox", "Outbox"), ("#deliveries", "Deliveries"), ("#grants", "Grants"))


def _skipped(skipped: Sequence[Row]) -> str:
    return table(skipped, [("issue", lambda r: issue_link(r.get("issue_number"))),
                           ("reason", lambda r: f"<code>{e(r.get('reason'))}</code>"),
                           ("detail", field("detail"))], empty="nothing skipped", test_id="skipped")


def _decision_now(doc: Row) -> str:
    picked = doc.get("issue_number")
    what = f"would lease {issue_link(picked)}" if picked is not None else e(doc.get("message") or "nothing to lease")
    return (f"<h3>For {e(doc.get('owner'))}: {status(doc.get('decision'))} {what}</h3>"
            f"<p class=muted>fingerprint <code>{e(doc.get('fingerprint'))}</code>, considered "
            f"{e(doc.get('considered'))}</p>" + _skipped(doc.get("skipped") or []))


def _decision_recorded(doc: Row) -> str:
    count = doc.get("count") or 1
    at = when(doc.get("at")) if count == 1 else (
        f'<span class="count">{e(count)}&times;</span> {when(doc.get("first_at"))} to {when(doc.get("at"))}')
    if doc.get("source") == "applied":
        head = (f"{at}: leased {issue_link(doc.get('issue_number'))} to {e(doc.get('owner'))}"
                f" (lease <code>{e(doc.get('lease_id'))}</code>, asked by {e(doc.get('requested_by'))})")
    else:
        head = (f"{at}: automatic run ({e(doc.get('trigger'))}): leased "
                f"{', '.join(issue_link(n) for n in doc.get('leased') or []) or '-'}, waiting "
                f"{', '.join(issue_link(n) for n in doc.get('waiting') or []) or '-'}")
    return f"<h3>{head}</h3>" + _skipped(doc.get("skipped") or [])


def _transitions(rows: Sequence[Row]) -> str:
    return table(rows, [
        ("issue", lambda r: issue_link(r.get("issue_number"))),
        ("key", lambda r: f"<code>{e(r.get('idempotency_key'))}</code>"),
        ("owner", field("owner")),
        ("phase", lambda r: status(r.get("phase"))),
        ("outcome", lambda r: status(r.get("outcome"))),
        ("journal phases", lambda r: tags(p.get("phase") for p in r.get("phases", []))),
        ("branch / worktree", lambda r: f"<code>{e(r.get('branch'))}</code><br><code>{e(r.get('worktree_path'))}"
                                       "</code>"),
        ("failed", lambda r: e(r.get("failed_phase")) + (as_json(r["error"]) if r.get("error") else "")),
    ], empty="no bootstrap transitions", test_id="bootstrap")


def _lease_rows(rows: Sequence[Row], empty: str, test_id: str) -> str:
    return table(rows, [
        ("issue", lambda r: issue_link(r.get("issue_number"))),
        ("owner", field("owner")), ("role", field("role")), ("action", field("action")),
        ("status", lambda r: status("live" if r.get("live") else r.get("status"))),
        ("expires", timed("expires_at")), ("heartbeat", timed("heartbeat_at")),
        ("ended", lambda r: when(r.get("ended_at")) + (f" ({e(r.get('end_reason'))})" if r.get("end_reason") else "")),
        ("lease", lambda r: f"<code>{e(r.get('lease_id'))}</code>"),
    ], empty=empty, test_id=test_id)


def _outbox_rows(rows: Sequence[Row], empty: str, test_id: str) -> str:
    def versions(r: Row) -> str:
        if r.get("status") != "verification_failed" and r.get("observed") is None:
            return e(r.get("last_error"))
        return (f'<div class="versions"><div><b>intended</b>{as_json(r.get("intended"))}</div>'
                f'<div><b>Gitea shows</b>{as_json(r.get("observed"))}</div></div>'
                + (f"<p>{e(r.get('last_error'))}</p>" if r.get("last_error") else ""))

    return table(rows, [
        ("id", field("id")), ("issue", lambda r: issue_link(r.get("issue"))), ("kind", field("kind")),
        ("status", lambda r: status(r.get("status"))), ("attempts", field("attempts")),
        ("key", lambda r: f"<code>{e(r.get('key'))}</code>"), ("detail", versions),
    ], empty=empty, test_id=test_id)


def _delivery_rows(rows: Sequence[Row], empty: str) -> str:
    return table(rows, [
        ("id", field("id")), ("received", timed("received_at")),
        ("event", lambda r: f"{e(r.get('event'))}/{e(r.get('action'))}"), ("sender", field("sender")),
        ("status", lambda r: status(r.get("status"))),
        ("outcome", lambda r: e(r.get("refused") or r.get("ignored_reason") or r.get("last_error"))),
        ("attempts", field("attempts")), ("delivery", lambda r: f"<code>{e(r.get('delivery'))}</code>"),
    ], empty=empty, test_id="deliveries")


def _grant_rows(runs: Sequence[Row]) -> str:
    if not runs:
        return '<p class="empty">no run grants</p>'
    out = []
    for g in runs:
        run = g.get("run", {})
        out.append(
            f"<h3>run <code>{e(run.get('run_id'))}</code> for {issue_link(run.get('issue_number'))}: "
            f"{e(run.get('policy'))}, {e(run.get('owner'))}, grant {status(g.get('grant_integrity'))} "
            f"outcome {status(run.get('outcome'))}</h3>"
            + table(g.get("calls", []), [("#", field("position")), ("effect", field("effect")),
                                         ("tool", field("tool")), ("arguments", lambda c: as_json(c.get("arguments")))],
                    empty="no calls", test_id="grant-calls")
            + table(g.get("decisions", []), [("at", timed("at")), ("decision", lambda d: status(d.get("kind"))),
                                             ("tool", field("tool")), ("#", field("position")),
                                             ("reason", field("reason")), ("category", field("category"))],
                    empty="no admission decisions yet", test_id="admissions"))
    return "".join(out)


def _waiting_for(seconds: object) -> str:
    if not isinstance(seconds, int) or isinstance(seconds, bool):
        return '<span class="muted">-</span>'
    hours, rest = divmod(seconds, 3600)
    return e(f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min {rest % 60} s")


def _queues(doc: Row | None) -> str:
    """The review and merge queues of the repository shown (``model.queues``), or why they cannot be read."""
    if not doc:
        return '<p class="empty">not read</p>'
    if doc.get("error"):
        return f'<p class="warn">{e(doc.get("message") or doc.get("error"))}</p>'
    running = ", ".join(str(q) for q in doc.get("running") or []) or "none (a controller hands them out)"
    waiting: list[tuple[str, Callable[[Row], str]]] = [
        ("issue", lambda r: issue_link(r.get("issue_number"))), ("PR", lambda r: e(f"#{r.get('pull_number')}")),
        ("title", field("title")), ("waiting", lambda r: _waiting_for(r.get("waiting_s"))),
        ("not for", lambda r: tags(r.get("barred_owners") or [])),
    ]
    approved: list[tuple[str, Callable[[Row], str]]] = [
        *waiting[:3], ("approved", lambda r: f"{e(r.get('approved_by'))} {when(r.get('approved_at'))}"),
        *waiting[3:],
    ]
    in_hand = table(doc.get("in_hand", []), [("issue", lambda r: issue_link(r.get("issue_number"))),
                                             ("owner", field("owner")), ("action", field("action")),
                                             ("expires", timed("expires_at"))],
                    empty="no review or merge lease in hand", test_id="queue-in-hand")
    return (
        f"<p>Running by themselves: {e(running)}; merges by {e(doc.get('merge_by'))}. Idle reviewers: "
        f"{tags(doc.get('idle_reviewers') or [])} Idle mergers: {tags(doc.get('idle_mergers') or [])}</p>"
        "<h3>Reviews waiting</h3>"
        + table(doc.get("reviews_waiting", []), waiting, empty="no pull request waits for review",
                test_id="reviews-waiting")
        + "<h3>Merges waiting (approval order)</h3>"
        + table(doc.get("merges_waiting", []), approved, empty="no approved pull request waits to merge",
                test_id="merges-waiting")
        + f"<h3>In hand</h3>{in_hand}"
    )


def counts(doc: Mapping[str, int]) -> str:
    return tags(f"{k}: {v}" for k, v in sorted(doc.items())) if doc else '<span class="muted">none</span>'


def overview_page(doc: Row, *, nonce: str | None = None, refresh_s: int = 0) -> str:
    token = _LINK_QUERY.set(_link_query(doc))
    now = _NOW.set(_moment(doc.get("generated_at")))
    try:
        return page("foreman dashboard", _overview_page(doc), nav=_NAV, nonce=nonce, refresh_s=refresh_s)
    finally:
        _NOW.reset(now)
        _LINK_QUERY.reset(token)


# --- the board: health, what needs a person, the flow -----------------------------------------------------------------
_OK_CLASS = {True: "ok", False: "bad", None: "warn"}


def _health(doc: Row | None) -> str:
    if not doc:
        return '<p class="empty">health not read</p>'
    ok = doc.get("ok")
    reasons = doc.get("reasons") or []
    if ok is True:
        banner = "Healthy: Gitea reachable, loops alive, catch-up current, nothing stuck in the outbox"
    elif ok is False:
        banner = "Not healthy: " + "; ".join(str(r) for r in reasons)
    else:
        banner = "Health unknown: " + "; ".join(str(r) for r in reasons)
    checks = "".join(
        f'<div class="check {_OK_CLASS.get(c.get("ok"), "warn")}" data-check="{e(c.get("name"))}">'
        f'<b>{e(c.get("name"))}: {e({True: "ok", False: "red", None: "?"}.get(c.get("ok")))}</b>'
        f'<span>{e(c.get("detail"))}</span></div>'
        for c in doc.get("checks") or []
    )
    return (f'<div class="banner {_OK_CLASS.get(ok, "warn")}" data-test="health-banner">{e(banner)}</div>'
            f'<div class="health">{checks}</div>')


def _card_html(card: Row) -> str:
    facts: list[tuple[str, str]] = [("state", status(card.get("state")))]
    if card.get("holder"):
        facts.append(("held by", f"{e(card.get('holder'))} ({e(card.get('action'))}) for {e(span(card.get('held_s')))}"
                                 f", since {when(card.get('held_since'))}"))
        facts.append(("heartbeat", when(card.get("heartbeat_at"))))
    if card.get("pull_number"):
        facts.append(("pull", e(f"#{card.get('pull_number')}")))
    if card.get("waits_for"):
        facts.append(("waits for", e(card.get("waits_for"))))
    title = e(card.get("title")) if card.get("title") else '<span class="muted">(title not seen yet)</span>'
    dl = "".join(f"<dt>{name}</dt><dd>{value}</dd>" for name, value in facts)
    return (f'<div class="card" data-issue="{e(card.get("issue_number"))}">'
            f'{issue_link(card.get("issue_number"))} <span class="t">{title}</span><dl>{dl}</dl></div>')


def _flow(doc: Row | None) -> str:
    if not doc:
        return '<p class="empty">no flow</p>'
    columns = []
    for column in doc.get("columns") or []:
        cards = column.get("cards") or []
        if column.get("key") in ("blocked", "other") and not cards:
            continue
        inner = "".join(_card_html(c) for c in cards) or '<p class="empty">none</p>'
        columns.append(f'<div class="col" data-column="{e(column.get("key"))}"><h3>{e(column.get("title"))}'
                       f' <span class="muted">({len(cards)})</span></h3>{inner}</div>')
    return f'<div class="board">{"".join(columns)}</div>'


def _needs(doc: Row | None) -> tuple[str, str]:
    """What needs a person (first screen), and the refused commands, webhook requests and ignored deliveries."""
    if not doc:
        return '<p class="empty">not read</p>', ""
    items: list[str] = []
    for card in doc.get("blocked") or []:
        items.append(f"{issue_link(card.get('issue_number'))} {e(card.get('title'))} is <b>blocked</b>: "
                     f"{e(card.get('next_action'))}; who is next: <b>{e(card.get('who_is_next'))}</b>")
    for entry in doc.get("outbox") or []:
        items.append(f"outbox entry {e(entry.get('id'))} ({e(entry.get('kind'))} on "
                     f"{issue_link(entry.get('issue'))}) is {status(entry.get('status'))}: {e(entry.get('last_error'))}"
                     " (see Outbox below; <code>foreman outbox</code>)")
    for d in doc.get("failed_deliveries") or []:
        items.append(f"delivery {e(d.get('id'))} ({e(d.get('event'))}/{e(d.get('action'))}) {status('failed')} "
                     f"after {e(d.get('attempts'))} attempts: {e(d.get('last_error'))} "
                     f"(<code>foreman replay {e(d.get('id'))}</code>)")
    for lease in doc.get("stranded") or []:
        items.append(f"stranded: {issue_link(lease.get('issue_number'))} {e(lease.get('owner'))}'s "
                     f"{e(lease.get('action'))} lease expired {when(lease.get('expires_at'))} ({e(lease.get('why'))})")
    needs = (f'<ul class="needs" data-test="needs">{"".join(f"<li>{i}</li>" for i in items)}</ul>' if items else
             '<p class="ok" data-test="needs">nothing needs a person now</p>')
    commands = table(doc.get("refused_commands") or [], [
        ("at", timed("at")), ("issue", lambda r: issue_link(r.get("issue_number"))),
        ("command", lambda r: f"<code>{e(r.get('command'))}</code>"), ("by", field("sender")),
        ("why", lambda r: f"<code>{e(r.get('error'))}</code> {e(r.get('message'))}"),
    ], empty="no command refused", test_id="refused-commands")
    refused = doc.get("refused_deliveries") or {}
    counts_line = ", ".join(f"{c.get('count')} &times; {e(c.get('status'))} {e(c.get('error'))}"
                            for c in refused.get("counts") or [])
    door = table(refused.get("recent") or [], [
        ("at", timed("at")), ("answer", lambda r: status(f"{r.get('status')} {r.get('error')}")),
        ("why", field("message")), ("from", field("remote")),
    ], empty="no webhook request refused since the service started", test_id="refused-deliveries")
    ignored = table(doc.get("ignored_deliveries") or [], [
        ("at", timed("received_at")), ("event", lambda r: f"{e(r.get('event'))}/{e(r.get('action'))}"),
        ("why", field("ignored_reason")), ("delivery", lambda r: f"<code>{e(r.get('delivery'))}</code>"),
    ], empty="no delivery ignored recently", test_id="ignored-deliveries")
    since = f" since {when(refused.get('since'))}" if refused.get("since") else ""
    return needs, (f"<h3>Refused commands</h3>{commands}"
                   f"<h3>Refused webhook requests{since}</h3>"
                   + (f"<p>{counts_line}</p>" if counts_line else "") + door
                   + f"<h3>Ignored deliveries</h3>{ignored}")


def _repository_cell(row: Row) -> str:
    if row.get("link"):
        shown = f"{e(row.get('key'))} (shown)" if row.get("selected") else e(row.get("key"))
        return f'<a href="{e(row["link"])}">{shown}</a>'
    return e(row.get("key"))


def _overview_page(doc: Row) -> str:
    repos = table(doc.get("repositories", []), [("repository", _repository_cell), ("Gitea", field("gitea_url"))],
                  empty="no repository configured", test_id="repositories")
    alloc = doc.get("allocator", {})
    ready = table(alloc.get("ready_candidates", []), [
        ("issue", lambda r: issue_link(r.get("issue_number"))), ("labels", lambda r: tags(r.get("labels", []))),
        ("blockers", lambda r: tags(r.get("blockers", [])))], empty="no status:ready issue", test_id="ready")
    now = "".join(_decision_now(d) for d in alloc.get("now", [])) or '<p class="empty">no author in the roster</p>'
    recorded = "".join(_decision_recorded(d) for d in alloc.get("recorded", [])) or (
        '<p class="empty">no allocation recorded yet</p>')
    lease = doc.get("leases", {})
    out = doc.get("outbox", {})
    dl = doc.get("deliveries", {})
    attention = doc.get("attention") or {}
    count = attention.get("count") or 0
    needs, refused = _needs(attention)
    body = (
        f'<section id="health"><h2>Health</h2>{_health(doc.get("health"))}</section>'
        f'<section id="needs"><h2>Needs a person now'
        + (f' <span class="tag bad">{e(count)}</span>' if count else "") + f"</h2>{needs}</section>"
        f'<section id="board"><h2>Board</h2>{_flow(doc.get("flow"))}</section>'
        f'<section id="refused"><h2>Refused and ignored</h2>{refused}</section>'
        f'<section id="repositories"><h2>Repositories</h2>{repos}'
        f'<p class="muted">as of {when(doc.get("generated_at"))}</p></section>'
        f'<section id="allocator"><h2>Allocator</h2><h3>Ready candidates</h3>{ready}'
        f"<h3>Decision now (dry run over the stored state)</h3>{now}<h3>Last decisions</h3>{recorded}</section>"
        f'<section id="queues"><h2>Queues</h2>{_queues(doc.get("queues"))}</section>'
        '<section id="leases"><h2>Leases</h2><h3>Live</h3>'
        + _lease_rows(lease.get("live", []), "no live lease", "live-leases")
        + (f"<h3>Marked live but expired</h3>{_lease_rows(lease['stale_live'], '', 'stale-leases')}"
           if lease.get("stale_live") else "")
        + f"<h3>Recent</h3>{_lease_rows(lease.get('recent', []), 'no lease yet', 'recent-leases')}</section>"
        f'<section id="bootstrap"><h2>Bootstrap transitions</h2>{_transitions(doc.get("bootstrap", []))}</section>'
        f'<section id="outbox"><h2>Outbox</h2><p>{counts(out.get("counts", {}))}</p><h3>Needs attention</h3>'
        f'{_outbox_rows(out.get("open", []), "nothing pending or parked", "outbox-open")}'
        f'<h3>Recent</h3>{_outbox_rows(out.get("recent", []), "no outbox entry yet", "outbox-recent")}</section>'
        f'<section id="deliveries"><h2>Deliveries</h2><p>{counts(dl.get("counts", {}))}</p>'
        f'{_delivery_rows(dl.get("recent", []), "no delivery yet")}</section>'
        f'<section id="grants"><h2>Run grants and admission decisions</h2>{_grant_rows(doc.get("grants", []))}'
        "</section>"
    )
    return body


# --- the issue page ---------------------------------------------------------------------------------------------------
def _intended(row: Row) -> str:
    """A comment as its text (what Gitea renders), any other write as its JSON."""
    intended = row.get("intended")
    if isinstance(intended, Mapping) and isinstance(intended.get("body"), str):
        return f"<pre>{e(intended['body'])}</pre>"
    return as_json(intended)


def issue_page(doc: Row, *, nonce: str | None = None, refresh_s: int = 0) -> str:
    token = _LINK_QUERY.set(_link_query(doc))
    now = _NOW.set(_moment(doc.get("generated_at")))
    try:
        return _issue_page(doc, nonce=nonce, refresh_s=refresh_s)
    finally:
        _NOW.reset(now)
        _LINK_QUERY.reset(token)


def _issue_page(doc: Row, *, nonce: str | None, refresh_s: int) -> str:
    number = doc.get("issue_number")
    snap = doc.get("snapshot")
    state = (
        table([snap], [("open", field("open")), ("labels", lambda r: tags(r.get("labels", []))),
                       ("state", lambda r: status(r.get("state"))), ("who is next", field("who_is_next")),
                       ("next action", field("next_action")), ("blockers", lambda r: tags(r.get("blockers", [])))],
              empty="", test_id="issue-state")
        if snap else '<p class="empty">no stored issue state</p>'
    )
    writes = table(doc.get("bot_writes", []), [
        ("kind", field("kind")), ("status", lambda r: status(r.get("status"))),
        ("key", lambda r: f"<code>{e(r.get('key'))}</code>"),
        ("what", _intended),
        ("Gitea shows", lambda r: as_json(r.get("observed") if r.get("observed") is not None else r.get("result"))),
    ], empty="the bot wrote nothing on this issue", test_id="bot-writes")
    comments = table(doc.get("comments", []), [
        ("comment", field("comment_id")), ("action", field("action")), ("author", field("author")),
        ("trusted", lambda r: status("trusted" if r.get("trusted") else "untrusted")),
        ("why", field("trust_reason")), ("state", field("state"))], empty="no comments recorded", test_id="comments")
    trees = table(doc.get("worktrees", []), [
        ("worktree", lambda r: f"<code>{e(r.get('worktree_path'))}</code>"),
        ("branch", lambda r: f"<code>{e(r.get('branch'))}</code>"), ("owner", field("owner")),
        ("registered", timed("registered_at")),
        ("ended", lambda r: when(r.get("ended_at")) + (f" ({e(r.get('end_reason'))})" if r.get("end_reason") else "")),
    ], empty="no worktree registered", test_id="worktrees")
    line = table(doc.get("timeline", []), [("at", timed("at")), ("what", lambda r: status(r.get("kind"))),
                                           ("summary", field("summary"))], empty="nothing recorded",
                 test_id="timeline")
    decisions = "".join(_decision_recorded(d) for d in doc.get("decisions", [])) or (
        '<p class="empty">no allocation decision named this issue</p>')
    body = (
        f'<section id="state"><h2>State</h2>{state}</section>'
        f'<section id="timeline"><h2>Timeline</h2>{line}</section>'
        f'<section id="decisions"><h2>Allocator decisions</h2>{decisions}</section>'
        f'<section id="leases"><h2>Leases</h2>{_lease_rows(doc.get("leases", []), "no lease", "issue-leases")}'
        "</section>"
        f'<section id="bootstrap"><h2>Bootstrap</h2>{_transitions(doc.get("bootstrap", []))}</section>'
        f'<section id="worktree"><h2>Worktree</h2>{trees}</section>'
        f'<section id="writes"><h2>Comments and changes the bot wrote</h2>{writes}</section>'
        f'<section id="comments"><h2>Comments read</h2>{comments}</section>'
        f'<section id="deliveries"><h2>Deliveries</h2>{_delivery_rows(doc.get("deliveries", []), "no delivery")}'
        f'</section><section id="grants"><h2>Run grants</h2>{_grant_rows(doc.get("grants", []))}</section>'
    )
    return page(f"{doc.get('repository')} #{number}", body, nav=(("/dashboard", "Dashboard"), ("#timeline", "Timeline"),
                                                            ("#writes", "Bot writes"), ("#worktree", "Worktree")),
                nonce=nonce, refresh_s=refresh_s)


def message_page(title: str, message: str) -> str:
    return page(title, f"<p>{e(message)}</p>", nav=(("/dashboard", "Dashboard"),))
