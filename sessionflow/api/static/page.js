// The live session page. All render state lives in the DOM (data attributes), so a reload
// restores the transcript from sessionStorage and resumes the stream after the last seq shown;
// a dropped connection resumes by itself (EventSource sends Last-Event-ID).
"use strict";

const root = document.querySelector("#session");
const sid = root.dataset.session;
const transcript = document.querySelector("#transcript");
const stateLine = document.querySelector("#state");
const notice = document.querySelector("#notice");
const spendLine = document.querySelector("#spend");
const saved = `sessionflow:${sid}`;
let lastSeq = -1;

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

// The session's phase (busy, idle) as the events and the status say, and whether the stream is
// connected: a dropped connection shows "reconnecting" until the stream is back, then the phase.
let phase = "connecting";
let connected = true;
// What a busy session waits for besides its model and tools (a host restarting), as the status says.
let waitingFor = "";

function show() {
  const shown = connected ? phase : "reconnecting";
  stateLine.dataset.state = shown;
  stateLine.textContent = shown === "busy" && waitingFor ? `busy · ${waitingFor}` : shown;
}

function setState(state) {
  phase = state;
  show();
}

function find(selector) {
  return transcript.querySelector(selector);
}

function assistant(messageId) {
  let block = find(`.assistant[data-message="${CSS.escape(messageId)}"]`);
  if (!block) {
    block = el("div", "assistant");
    block.dataset.message = messageId;
    transcript.append(block);
  }
  return block;
}

function part(messageId, kind, ordinal) {
  const block = assistant(messageId);
  const key = `${kind}:${ordinal}`;
  let node = block.querySelector(`[data-part="${CSS.escape(key)}"]`);
  if (!node) {
    if (kind === "reasoning") {
      node = el("details", "reasoning");
      node.append(el("summary", "", "reasoning"), el("div", "body"));
    } else {
      node = el("div", "text");
    }
    node.dataset.part = key;
    block.append(node);
  }
  return kind === "reasoning" ? node.querySelector(".body") : node;
}

function card(messageId, callId, name) {
  const block = assistant(messageId);
  let node = block.querySelector(`.tool[data-call="${CSS.escape(callId)}"]`);
  if (!node) {
    node = el("div", "tool");
    node.dataset.call = callId;
    const head = el("header");
    head.append(el("span", "name", name || "tool"), el("span", "status", "pending"),
      el("span", "duration", ""));
    node.append(head, el("pre", "input", ""), el("pre", "output", ""));
    block.append(node);
  }
  return node;
}

// A task call's child session: a link to its own page, under the call.
function childLink(node, sessionId, agent) {
  if (node.querySelector("a.child")) return;
  const link = el("a", "child", `${agent || "subagent"} session ${sessionId}`);
  link.href = `/view/${encodeURIComponent(sessionId)}`;
  node.append(link);
}

// A call waiting for a person is not running: it shows what it waits for, and no clock.
const WAITING = { permission: "waiting for approval", question: "waiting for an answer" };

function setCard(node, state, created) {
  node.dataset.state = state;
  node.querySelector(".status").textContent = state;
  if (state === "waiting") {
    node.querySelector(".status").textContent = WAITING[node.dataset.waiting] || "waiting";
    node.querySelector(".duration").textContent = "";
    delete node.dataset.started;
  }
  if (state === "running") node.dataset.started = String(created);
  if ((state === "completed" || state === "error") && node.dataset.started) {
    const seconds = (created - Number(node.dataset.started)) / 1000;
    node.querySelector(".duration").textContent = `${seconds.toFixed(2)} s`;
  }
}

// A waiting permission ask (approve / always / deny) or question (answer) on its tool's card.
function ask(request) {
  const node = card(request.assistant_message_id, request.call_id, request.tool);
  node.dataset.waiting = request.kind;
  setCard(node, "waiting", 0);
  const box = el("div", "ask");
  box.dataset.request = request.request_id;
  box.dataset.kind = request.kind;
  if (request.kind === "question") {
    box.append(el("p", "question", request.question || "The agent asks:"));
    for (const option of request.options || []) {
      const choice = el("button", "option", option);
      Object.assign(choice.dataset, { reply: "answer", answer: option });
      box.append(choice);
    }
    const input = el("input", "answer");
    input.placeholder = "your answer";
    const send = el("button", "send-answer", "Answer");
    send.dataset.reply = "answer";
    box.append(input, send);
  } else {
    box.append(el("p", "summary", `${request.tool} wants to run: ${request.summary}`));
    for (const [decision, label] of [["once", "Approve"], ["always", "Always"], ["reject", "Deny"]]) {
      const button = el("button", decision === "reject" ? "deny" : `approve ${decision}`, label);
      Object.assign(button.dataset, { reply: "decision", decision });
      box.append(button);
    }
  }
  node.append(box);
}

async function reply(button) {
  const box = button.closest(".ask");
  const request = encodeURIComponent(box.dataset.request);
  const answer = button.dataset.answer ?? (box.querySelector("input.answer") || {}).value;
  const [path, body] = button.dataset.reply === "answer"
    ? [`requests/${request}/answer`, { text: answer || "" }]
    : [`requests/${request}/reply`, { decision: button.dataset.decision }];
  const buttons = box.querySelectorAll("button");
  buttons.forEach((b) => { b.disabled = true; });
  notice.textContent = "";
  try {
    const answered = await post(path, body);
    if (answered.status === "sent") notice.textContent = "reply sent: it applies when a worker runs";
  } catch (error) {
    notice.textContent = error.message;
    buttons.forEach((b) => { b.disabled = false; });
  }
}

// Delegated: the buttons of a transcript restored after a reload work too.
transcript.addEventListener("click", (e) => {
  const button = e.target.closest(".ask button[data-reply]");
  if (button && !button.disabled) reply(button);
});

function marker(text, className) {
  transcript.append(el("div", `marker ${className || ""}`, text));
}

function contentText(content) {
  return (content || []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
}

const handlers = {
  "session.prompt.admitted": (d) => {
    const node = el("div", "user", d.prompt.text);
    node.dataset.input = d.input_id;
    node.append(el("span", "badge", d.delivery === "queue" ? "queued" : "pending"));
    transcript.append(node);
  },
  "session.prompt.promoted": (d, e) => {
    const node = find(`.user[data-input="${CSS.escape(d.input_id)}"]`);
    if (!node) return;
    node.dataset.seq = String(e.seq);  // the user message's place is its promotion
    node.querySelector(".badge").textContent = "delivered";
    revertButton(node, d.input_id);
  },
  "session.step.ended": (d) => revertButton(assistant(d.assistant_message_id), d.assistant_message_id),
  "session.reverted": (d, e) => {
    for (const node of transcript.children) {
      const seq = Number(node.dataset.seq);
      if (seq >= d.boundary_seq && seq < e.seq && !node.dataset.hiddenBy) {
        node.dataset.hiddenBy = String(e.seq);
        node.classList.add("reverted");
      }
    }
    marker(`reverted to ${d.message_id}: ${files(d.paths)}`, "revert");
  },
  "session.unreverted": (d) => {
    const hidden = [...transcript.querySelectorAll(".reverted")];
    const last = Math.max(...hidden.map((node) => Number(node.dataset.hiddenBy)));
    for (const node of hidden) {
      if (Number(node.dataset.hiddenBy) === last) {
        node.classList.remove("reverted");
        delete node.dataset.hiddenBy;
      }
    }
    marker(`revert undone: ${files(d.paths)}`, "revert");
  },
  "session.revert.committed": () => {
    for (const node of transcript.querySelectorAll(".reverted")) node.remove();
  },
  "session.message.copied": (d) => copied(d.message),
  "session.forked": (d) => {
    const note = el("div", "marker fork", `forked at ${d.message_id}: `);
    const link = el("a", "fork", `session ${d.fork_session_id}`);
    link.href = `/view/${encodeURIComponent(d.fork_session_id)}`;
    note.append(link, document.createTextNode(` in ${d.directory}`));
    transcript.append(note);
  },
  "session.execution.started": () => setState("busy"),
  "session.execution.succeeded": () => { setState("idle"); marker("done", "succeeded"); },
  "session.execution.interrupted": (d) => {
    setState("idle");
    marker(`interrupted (${d.reason})`, "interrupted");
  },
  "session.execution.failed": (d) => {
    setState("idle");
    marker(`failed: ${d.error.message}`, "error failed");
  },
  "session.step.started": (d) => assistant(d.assistant_message_id),
  "session.text.delta": (d) => {
    part(d.assistant_message_id, "text", d.ordinal).textContent += d.delta;
  },
  "session.text.ended": (d) => {
    part(d.assistant_message_id, "text", d.ordinal).textContent = d.text;
  },
  "session.reasoning.delta": (d) => {
    part(d.assistant_message_id, "reasoning", d.ordinal).textContent += d.delta;
  },
  "session.reasoning.ended": (d) => {
    part(d.assistant_message_id, "reasoning", d.ordinal).textContent = d.text;
  },
  "session.tool.input.started": (d) => card(d.assistant_message_id, d.call_id, d.name),
  "session.tool.input.delta": (d) => {
    card(d.assistant_message_id, d.call_id).querySelector(".input").textContent += d.delta;
  },
  "session.tool.called": (d, e) => {
    const node = card(d.assistant_message_id, d.call_id, d.name);
    node.querySelector(".name").textContent = d.name;
    node.querySelector(".input").textContent = JSON.stringify(d.input, null, 2);
    setCard(node, d.executed ? "completed" : "running", e.created);
  },
  "session.tool.progress": (d) => {
    const node = card(d.assistant_message_id, d.call_id);
    const output = node.querySelector(".output");
    output.textContent = contentText(d.content) || output.textContent;
    const child = d.structured && d.structured.child;
    if (child) childLink(node, child.session_id, child.agent);
  },
  "session.tool.success": (d, e) => {
    const node = card(d.assistant_message_id, d.call_id);
    node.querySelector(".output").textContent = d.output ?? contentText(d.content);
    if (d.structured && d.structured.task_id) {
      childLink(node, d.structured.task_id, d.structured.agent);
    }
    setCard(node, "completed", e.created);
  },
  "session.tool.failed": (d, e) => {
    const node = card(d.assistant_message_id, d.call_id);
    const output = node.querySelector(".output");
    output.textContent = d.error.message;
    output.classList.add("error");
    setCard(node, "error", e.created);
  },
  "session.todo.updated": (d) => {
    // One list, the latest, where the session is now: an older one is replaced.
    const old = find("ul.todos");
    if (old) old.remove();
    const list = el("ul", "todos");
    for (const todo of d.todos) {
      const item = el("li", todo.status, todo.content);
      item.dataset.status = todo.status;
      list.append(item);
    }
    transcript.append(list);
  },
  "session.permission.asked": (d) => ask(d.request),
  "session.permission.replied": (d, e) => {
    const box = find(`.ask[data-request="${CSS.escape(d.request_id)}"]`);
    if (!box) return;
    const node = box.closest(".tool");
    if (node && node.dataset.state === "waiting") setCard(node, "running", e.created);
    const who = d.by ? ` by ${d.by}` : "";
    const what = d.answer !== null && d.answer !== undefined ? `answered “${d.answer}”`
      : { once: "approved", always: "approved (always)", reject: "denied" }[d.decision];
    const why = d.reason === "answered" ? "" : ` (${d.reason})`;
    box.replaceChildren(el("p", "replied", `${what}${who}${why}`));
    box.dataset.replied = d.decision;
  },
  "session.step.failed": (d) => {
    assistant(d.assistant_message_id).append(el("div", "error", `${d.error.type}: ${d.error.message}`));
  },
  "session.retry.scheduled": (d) => marker(`retrying (attempt ${d.attempt}): ${d.error.message}`),
  "session.synthetic": (d) => marker(d.text || "note"),
  "session.compaction.started": () => marker("compacting the history…"),
  "session.compaction.ended": () => marker("history compacted"),
  "session.compaction.failed": (d) => marker(`compaction failed: ${d.error.message}`, "error"),
};

// A fork's history, one copied message at a time, drawn as the events first drew it.
function copied(m) {
  if (m.type === "user") {
    const node = el("div", "user", m.text);
    node.append(el("span", "badge", "delivered"));
    transcript.append(node);
    revertButton(node, m.id);
  } else if (m.type === "assistant") {
    for (const p of m.content) {
      if (p.type === "tool") {
        const node = card(m.id, p.call_id, p.name);
        node.querySelector(".input").textContent = JSON.stringify(p.state.input, null, 2);
        const output = node.querySelector(".output");
        const failed = p.state.status === "error";
        output.textContent = failed ? p.state.error.message : contentText(p.state.content);
        if (failed) output.classList.add("error");
        setCard(node, p.state.status, m.time_created);
      } else {
        part(m.id, p.type, p.ordinal).textContent = p.text;
      }
    }
    revertButton(assistant(m.id), m.id);
  } else if (m.type === "compaction") {
    marker("history compacted");
  } else if (m.text) {
    marker(m.text);
  }
}

function files(paths) {
  return paths.length ? paths.map((p) => p.path).join(", ") : "no file changed";
}

// "Revert to here" on a message: the workspace and the conversation go back to it.
function revertButton(node, messageId) {
  if (node.querySelector(":scope > button.revert")) return;
  const button = el("button", "revert", "revert to here");
  button.dataset.revert = messageId;
  button.title = "put the workspace and the conversation back to this message";
  node.append(button);
}

async function revertTo(button) {
  notice.textContent = "";
  button.disabled = true;
  try {
    const answer = await fetch(`/sessions/${encodeURIComponent(sid)}/revert`, {
      method: "POST",
      headers: { "Content-Type": "application/json" },
      body: JSON.stringify({ message_id: button.dataset.revert }),
    });
    const plan = await answer.json();
    if (plan.refused) notice.textContent = `revert refused: ${plan.refused}`;
    const refusals = (plan.paths || []).filter((p) => p.refused);
    if (refusals.length) {
      notice.textContent = "revert refused, nothing changed: "
        + refusals.map((p) => `${p.path} (${p.reason})`).join("; ");
    }
    if (!answer.ok && !plan.paths) notice.textContent = `revert: ${answer.statusText}`;
  } finally {
    button.disabled = false;
  }
}

transcript.addEventListener("click", (e) => {
  const button = e.target.closest("button.revert");
  if (button && !button.disabled) revertTo(button);
});

function render(event) {
  const handler = handlers[event.type];
  if (handler) handler(event.data, event);
  // Every block carries the seq that made it: a revert hides the blocks after its message.
  for (let node = transcript.lastElementChild; node && !node.dataset.seq;
    node = node.previousElementSibling) {
    node.dataset.seq = String(event.seq);
  }
  // What the session spent changes with each step; a busy period's end may be its budget.
  if (root.dataset.synced && (event.type === "session.step.ended"
      || event.type.startsWith("session.execution.") || event.type === "session.budget.set")) {
    setTimeout(refreshState, 0);
  }
}

function restore() {
  const state = JSON.parse(sessionStorage.getItem(saved) || "null");
  if (state && Number.isInteger(state.seq)) {
    transcript.innerHTML = state.html;  // our own serialization: text went in as textContent
    lastSeq = state.seq;
    root.dataset.seq = String(lastSeq);
    setState(state.state || "connecting");
  }
}

function follow() {
  const source = new EventSource(`/sessions/${encodeURIComponent(sid)}/events?after=${lastSeq}`);
  source.onmessage = (message) => {
    const event = JSON.parse(message.data);
    if (event.seq <= lastSeq) return;
    lastSeq = event.seq;
    root.dataset.seq = String(lastSeq);
    if (waitingFor && event.type.startsWith("session.tool.")) {
      waitingFor = "";  // the call moved on: the next status says whether it still waits
      show();
    }
    render(event);
  };
  source.addEventListener("synced", () => {
    root.dataset.synced = "true";
    refreshState();
  });
  source.onerror = () => {
    connected = false;
    show();
    // The browser retries a dropped stream by itself (with Last-Event-ID), but gives up when
    // a retry fails outright (the server was down): start again after the last seq shown.
    if (source.readyState === EventSource.CLOSED) setTimeout(follow, 1000);
  };
  source.onopen = () => { connected = true; show(); };
}

async function refreshState() {
  const asked = lastSeq;
  const answer = await fetch(`/sessions/${encodeURIComponent(sid)}/status`);
  const status = answer.ok ? await answer.json() : null;
  // An event that arrived meanwhile is newer than this answer.
  if (!status || lastSeq !== asked) return;
  const hosts = (status.drain && status.drain.waiting_hosts) || [];
  const waits = hosts.map((host) => `waiting for host ${host}`);
  if (status.drain && status.drain.waiting_capacity) waits.push(status.drain.waiting_capacity);
  waitingFor = waits.join(" · ");
  setState(status.busy ? "busy" : "idle");
  showSpend(status);
}

function steps(n) {
  return n === 1 ? "1 step" : `${n} steps`;
}

// What the session spent and whether its budget stops it, as the status says.
function showSpend(status) {
  const spend = status.spend;
  if (!spend) return;
  let text = spend.cost === null
    ? `cost unknown (${steps(spend.unpriced_steps)} unpriced)`
    : `$${spend.usd.toFixed(4)}`;
  if (spend.cost !== null && spend.unpriced_steps) text += ` (${steps(spend.unpriced_steps)} unpriced)`;
  const reached = status.budget_reached;
  if (reached && reached.limit === "usd") {
    text += ` · budget reached: $${reached.spent.toFixed(4)} of $${reached.allowed}`;
  } else if (reached) {
    text += ` · budget reached: ${reached.spent} tokens of ${reached.allowed}`;
  } else if (status.budget) {
    const limits = [];
    if (status.budget.usd !== null) limits.push(`$${status.budget.usd}`);
    if (status.budget.tokens !== null) limits.push(`${status.budget.tokens} tokens`);
    text += ` · budget ${limits.join(" and ")}`;
  }
  spendLine.dataset.reached = reached ? reached.limit : "";
  spendLine.textContent = text;
}

// A running call sends no events while it waits for its host: ask the status now and then.
setInterval(() => {
  if (connected && phase === "busy") refreshState();
}, 3000);

async function post(path, body) {
  const answer = await fetch(`/sessions/${encodeURIComponent(sid)}/${path}`, {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify(body),
  });
  const payload = await answer.json();
  if (!answer.ok) throw new Error(payload.error ? payload.error.message : answer.statusText);
  return payload;
}

function inputId() {
  const bytes = crypto.getRandomValues(new Uint8Array(12));
  return "msg_web_" + Array.from(bytes, (b) => b.toString(16).padStart(2, "0")).join("");
}

// One id per prompt: a retry after an error admits it at most once.
let pendingId = inputId();
document.querySelector("#prompt").addEventListener("submit", async (e) => {
  e.preventDefault();
  const form = new FormData(e.target);
  notice.textContent = "";
  try {
    await post("prompt", { text: form.get("text"), delivery: form.get("delivery"), input_id: pendingId });
    pendingId = inputId();
    e.target.reset();
  } catch (error) {
    notice.textContent = error.message;
  }
});

document.querySelector("#interrupt").addEventListener("click", async () => {
  notice.textContent = "";
  try {
    const answer = await post("interrupt", { reason: "user" });
    if (answer.status !== "stopped") notice.textContent = `interrupt: ${answer.status}`;
  } catch (error) {
    notice.textContent = error.message;
  }
});

setInterval(() => {
  for (const node of transcript.querySelectorAll('.tool[data-state="running"]')) {
    const seconds = (Date.now() - Number(node.dataset.started)) / 1000;
    node.querySelector(".duration").textContent = `${Math.max(seconds, 0).toFixed(1)} s`;
  }
}, 250);

window.addEventListener("pagehide", () => {
  const state = { seq: lastSeq, html: transcript.innerHTML, state: phase };
  sessionStorage.setItem(saved, JSON.stringify(state));
});

restore();
follow();
