"""Server-rendered HTML for the dashboard: small functions over the view model, every value escaped, no script."""

from __future__ import annotations

import html
import json
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
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
@media (max-width:40rem){body{font-size:14px;padding:.5rem}.versions{grid-template-columns:1fr}
  .scroll table{min-width:46rem}td.wrap{max-width:18rem}}
"""

_STATUS_CLASS = {
    "done": "ok", "completed": "ok", "live": "ok", "admitted": "ok", "intact": "ok", "select": "ok",
    "failed": "bad", "verification_failed": "bad", "parked": "bad", "compensated": "bad", "denied": "bad",
    "invalid": "bad", "blocked": "bad", "expired": "warn", "pending": "warn", "queued": "warn", "sending": "warn",
    "processing": "warn", "ignored": "muted", "ignored_self": "muted", "released": "muted", "wait": "warn",
}


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


def page(title: str, body: str, *, nav: Sequence[tuple[str, str]] = ()) -> str:
    links = "".join(f'<a href="{e(href)}">{e(text)}</a>' for href, text in nav)
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width,initial-scale=1">'
        '<meta name=referrer content=no-referrer>'
        f"<title>{e(title)}</title><style>{_STYLE}</style></head><body>"
        f"<header><h1>{e(title)}</h1><nav>{links}</nav></header><main>{body}</main>"
        '<footer class="muted"><p>Read-only. The same data as JSON: <a href="/dashboard/api/overview">'
        "/dashboard/api/overview</a>.</p></footer></body></html>"
    )


# --- the front page ---------------------------------------------------------------------------------------------------
_NAV = (("#repositories", "Repositories"), ("#allocator", "Allocator"), ("#queues", "Queues"), ("#leases", "Leases"),
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
    if doc.get("source") == "applied":
        head = (f"{e(doc.get('at'))}: leased {issue_link(doc.get('issue_number'))} to {e(doc.get('owner'))}"
                f" (lease <code>{e(doc.get('lease_id'))}</code>, asked by {e(doc.get('requested_by'))})")
    else:
        head = (f"{e(doc.get('at'))}: automatic run ({e(doc.get('trigger'))}): leased "
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
        ("expires", field("expires_at")), ("heartbeat", field("heartbeat_at")),
        ("ended", lambda r: e(r.get("ended_at")) + (f" ({e(r.get('end_reason'))})" if r.get("end_reason") else "")),
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
        ("id", field("id")), ("received", field("received_at")),
        ("event", lambda r: f"{e(r.get('event'))}/{e(r.get('action'))}"), ("sender", field("sender")),
        ("status", lambda r: status(r.get("status"))),
        ("outcome", lambda r: e(r.get("ignored_reason") or r.get("last_error"))),
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
            + table(g.get("decisions", []), [("at", field("at")), ("decision", lambda d: status(d.get("kind"))),
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
        *waiting[:3], ("approved", lambda r: f"{e(r.get('approved_by'))} at {e(r.get('approved_at'))}"),
        *waiting[3:],
    ]
    in_hand = table(doc.get("in_hand", []), [("issue", lambda r: issue_link(r.get("issue_number"))),
                                             ("owner", field("owner")), ("action", field("action")),
                                             ("expires", field("expires_at"))],
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


def overview_page(doc: Row) -> str:
    token = _LINK_QUERY.set(_link_query(doc))
    try:
        return _overview_page(doc)
    finally:
        _LINK_QUERY.reset(token)


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
    body = (
        f'<section id="repositories"><h2>Repositories</h2>{repos}'
        f'<p class="muted">as of {e(doc.get("generated_at"))}</p></section>'
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
    return page("foreman dashboard", body, nav=_NAV)


# --- the issue page ---------------------------------------------------------------------------------------------------
def _intended(row: Row) -> str:
    """A comment as its text (what Gitea renders), any other write as its JSON."""
    intended = row.get("intended")
    if isinstance(intended, Mapping) and isinstance(intended.get("body"), str):
        return f"<pre>{e(intended['body'])}</pre>"
    return as_json(intended)


def issue_page(doc: Row) -> str:
    token = _LINK_QUERY.set(_link_query(doc))
    try:
        return _issue_page(doc)
    finally:
        _LINK_QUERY.reset(token)


def _issue_page(doc: Row) -> str:
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
        ("registered", field("registered_at")),
        ("ended", lambda r: e(r.get("ended_at")) + (f" ({e(r.get('end_reason'))})" if r.get("end_reason") else "")),
    ], empty="no worktree registered", test_id="worktrees")
    line = table(doc.get("timeline", []), [("at", field("at")), ("what", lambda r: status(r.get("kind"))),
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
                                                            ("#writes", "Bot writes"), ("#worktree", "Worktree")))


def message_page(title: str, message: str) -> str:
    return page(title, f"<p>{e(message)}</p>", nav=(("/dashboard", "Dashboard"),))
