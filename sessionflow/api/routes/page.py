"""The live page: server-rendered HTML and one small script, no build step.

``/`` lists sessions; ``/view/{id}`` shows one live: the script follows the session's SSE stream
with ``EventSource`` and keeps the transcript's state in the DOM, so a reload restores it from
``sessionStorage`` and resumes after the last seq it rendered.
"""

from __future__ import annotations

import time
from html import escape

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse

from sessionflow.api.deps import Client, SessionId, Settings
from sessionflow.api.guard import authorized
from sessionflow.models.drain import workflow_id
from store.sessions import SessionInfo

router = APIRouter(include_in_schema=False)


@router.get("/", response_class=HTMLResponse)
async def index(request: Request, client: Client) -> str:
    if not authorized(request):
        return _login()
    sessions = await client.list_sessions(limit=100)
    rows = "".join(_row(info) for info in sessions) or (
        '<tr><td colspan="4" class="empty">No sessions yet: create one with '
        "<code>POST /sessions</code> or <code>sessionflow new</code>.</td></tr>"
    )
    return _page(
        "sessions",
        '<table id="sessions"><thead><tr><th>session</th><th>title</th><th>workspace</th>'
        f"<th>updated</th></tr></thead><tbody>{rows}</tbody></table>",
    )


def _row(info: SessionInfo) -> str:
    updated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.time_updated / 1000))
    return (
        f'<tr><td><a href="/view/{escape(info.id)}">{escape(info.id)}</a></td>'
        f"<td>{escape(info.title or '(untitled)')}</td><td><code>{escape(info.directory)}</code>"
        f"</td><td>{updated}</td></tr>"
    )


@router.get("/view/{session_id}", response_class=HTMLResponse)
async def view(request: Request, session_id: SessionId, client: Client, settings: Settings) -> str:
    if not authorized(request):
        return _login()
    info = await client.session(session_id)
    ui = settings.temporal_ui or ""
    link = f"{ui.rstrip('/')}/namespaces/{settings.namespace}/workflows/{workflow_id(info.id)}"
    model = escape(str(info.model) if info.model else "no model")
    return _page(
        info.title or info.id,
        f"""<section id="session" data-session="{escape(info.id)}">
<header class="meta"><h1>{escape(info.title or info.id)}</h1>
<p><code>{escape(info.id)}</code> · {model} · <code>{escape(info.directory)}</code></p>
<p><span id="state" data-state="connecting">connecting</span> ·
<span id="spend">{escape(info.spend.describe())}</span> ·
<a id="temporal" href="{escape(link)}" target="_blank" rel="noopener">workflow in the Temporal
UI</a></p></header>
<div id="transcript" aria-live="polite"></div>
<p id="notice" role="status"></p>
<form id="prompt"><textarea name="text" rows="3" placeholder="Prompt the agent" required></textarea>
<div class="actions"><select name="delivery" aria-label="delivery">
<option value="steer">steer (join the running turn)</option>
<option value="queue">queue (after the current turn)</option></select>
<button type="submit" id="send">Send</button>
<button type="button" id="interrupt">Interrupt</button></div></form>
</section><script src="/static/page.js"></script>""",
    )


def _login() -> str:
    return _page(
        "sign in",
        """<form id="login"><p>This server needs its token (<code>SESSIONFLOW_API_TOKEN</code>).
</p><input type="password" name="token" placeholder="token" required autofocus>
<button type="submit">Open</button></form>
<script>document.querySelector("#login").addEventListener("submit", (e) => {
  e.preventDefault();
  const token = encodeURIComponent(new FormData(e.target).get("token"));
  document.cookie = `sessionflow_token=${token}; path=/; SameSite=Strict`;
  location.reload();
});</script>""",
    )


def _page(title: str, body: str) -> str:
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport"
content="width=device-width, initial-scale=1"><title>{escape(title)} · sessionflow</title>
<link rel="stylesheet" href="/static/page.css"></head>
<body><nav><a href="/">sessionflow</a></nav><main>{body}</main></body></html>"""
