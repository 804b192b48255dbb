// spindle inspector. Model text is only ever set with textContent: nothing
// the model wrote is parsed as HTML. The page keeps at most MAX_NODES
// elements per stream in the DOM and says how many it hid.
"use strict";

const MAX_NODES = 2000;
const MAX_ROWS = 1000;
const token = new URLSearchParams(location.search).get("token");
const q = token ? "?token=" + encodeURIComponent(token) : "";
const rows = new Map();
let selected = null;
let nodes = 0;
let hidden = 0;
let boxes = new Map();

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

function fmtTime(ms) {
  const d = new Date(ms);
  return d.toLocaleTimeString();
}

function renderRow(s) {
  let tr = rows.get(s.id);
  if (!tr) {
    tr = el("tr", "stream");
    tr.dataset.id = String(s.id);
    tr.addEventListener("click", () => select(s.id));
    rows.set(s.id, tr);
    const body = document.getElementById("stream-rows");
    body.insertBefore(tr, body.firstChild);
    while (body.children.length > MAX_ROWS) {
      const last = body.lastChild;
      rows.delete(Number(last.dataset.id));
      body.removeChild(last);
    }
  }
  tr.replaceChildren(
    el("td", null, s.id),
    el("td", null, s.model || ""),
    el("td", null, fmtTime(s.started)),
    el("td", null, s.duration_ms === null ? "" : s.duration_ms),
    el("td", null, s.bytes),
    el("td", null, s.repairs),
    el("td", null, s.tool_calls),
    el("td", "outcome", s.outcome),
  );
  tr.classList.toggle("live", s.outcome === "live");
  tr.classList.toggle("failed", !["live", "ok", "done_added", "rewritten"].includes(s.outcome));
  tr.classList.toggle("selected", s.id === selected);
  if (s.id === selected) renderTiming(s);
}

function renderTiming(s) {
  const t = document.getElementById("timing");
  t.replaceChildren(
    el("div", "meta", "model " + (s.model || "?") + " · " + s.path + " · status " + s.status + " · " + s.outcome),
    el("div", "meta", "first byte " + (s.first_byte_ms ?? "–") + " ms · longest gap " + s.max_gap_ms +
      " ms · " + s.chunks + " chunks · " + s.bytes + " bytes · " + (s.duration_ms ?? "–") + " ms"),
  );
  document.getElementById("note").textContent = s.dropped_events
    ? s.dropped_events + " events past the per-stream limit were not kept" : "";
}

function add(node) {
  const box = document.getElementById("elements");
  box.appendChild(node);
  nodes++;
  while (nodes > MAX_NODES && box.firstChild) {
    box.removeChild(box.firstChild);
    nodes--;
    hidden++;
  }
  if (hidden) document.getElementById("note").textContent = hidden + " earlier events hidden";
}

function elementBox(id, tag) {
  const key = String(id);
  let b = boxes.get(key);
  if (!b) {
    const cls = tag === "thought" ? "el thought" : /tool|call/.test(tag) ? "el call" : "el";
    const div = el("div", cls);
    div.appendChild(el("span", "tag", tag));
    const text = el("span", "text");
    div.appendChild(text);
    b = { div, text };
    boxes.set(key, b);
    add(div);
  }
  return b;
}

function showEvent(ev) {
  const choice = ev.choice ?? 0;
  const key = (id) => choice + ":" + id;
  switch (ev.type) {
    case "delta": {
      const b = elementBox(key(ev.id), ev.tag);
      b.text.textContent += ev.text;
      break;
    }
    case "element": {
      // What spindle made of it (streamed, filtered), then, when different,
      // what the model wrote, and the typed payload.
      const b = elementBox(key(ev.id), ev.tag);
      if (!b.text.textContent) {
        b.text.textContent = ev.text;
      } else if (b.text.textContent !== ev.text) {
        b.div.appendChild(el("div", "meta raw", "as written: " + ev.text));
      }
      if (ev.payload !== null && ev.payload !== undefined) {
        b.div.appendChild(el("div", "meta payload", "payload: " + JSON.stringify(ev.payload)));
      }
      break;
    }
    case "call_delta": {
      const b = elementBox(key(ev.id), ev.tag);
      if (ev.name) b.text.textContent += ev.name + " ";
      b.text.textContent += ev.arguments || "";
      break;
    }
    case "repair": {
      const r = el("div", "repair");
      r.appendChild(el("span", null, "repair " + ev.kind + (ev.tag ? " <" + ev.tag + ">" : "") + ": "));
      if (ev.from) r.appendChild(el("span", "from", ev.from));
      if (ev.text) r.appendChild(el("span", "to", " → " + ev.text));
      add(r);
      break;
    }
    case "diagnostic":
      add(el("div", "diag", ev.level + " " + ev.code + ": " + ev.message));
      break;
    case "finish":
      add(el("div", "meta", "finish: " + ev.reason));
      break;
    case "usage":
      add(el("div", "meta", "usage: " + JSON.stringify(ev.usage)));
      break;
    case "stream_error":
      add(el("div", "diag", "stream error: " + JSON.stringify(ev.error)));
      break;
    case "turn_start":
      // An agent turn: its element ids start again at 0.
      boxes = new Map();
      add(el("div", "meta", "turn " + ev.turn + " (" + ev.messages + " messages sent)"));
      break;
    case "tool_result":
      add(el("div", ev.ok ? "meta" : "diag", "tool " + ev.tool_id + " (" + ev.duration_ms + " ms): " + ev.observation));
      break;
    case "truncated":
      add(el("div", "diag", "truncated: " + ev.why));
      break;
    default:
      break;
  }
}

async function select(id) {
  selected = id;
  for (const [rid, tr] of rows) tr.classList.toggle("selected", rid === id);
  document.getElementById("elements").replaceChildren();
  boxes = new Map();
  nodes = 0;
  hidden = 0;
  document.getElementById("detail-head").textContent = "stream " + id;
  const r = await fetch("/ui/api/streams/" + id + q);
  if (!r.ok) return;
  const v = await r.json();
  if (selected !== id) return;
  renderTiming(v.stream);
  for (const ev of v.events) showEvent(ev);
}

async function start() {
  const r = await fetch("/ui/api/streams" + q);
  if (r.ok) {
    const list = await r.json();
    for (const s of list) renderRow(s);
    if (list.length && selected === null) select(list[list.length - 1].id);
  }
  const es = new EventSource("/ui/api/events" + q);
  const status = document.getElementById("status");
  es.onopen = () => { status.textContent = "live"; };
  es.onerror = () => { status.textContent = "reconnecting…"; };
  es.onmessage = (m) => {
    const msg = JSON.parse(m.data);
    if (msg.type === "start") {
      renderRow(msg.stream);
      if (selected === null) select(msg.stream.id);
    } else if (msg.type === "end") {
      renderRow(msg.stream);
    } else if (msg.type === "event" && msg.stream === selected) {
      showEvent(msg.event);
    } else if (msg.type === "lagged") {
      status.textContent = "fell behind by " + msg.missed + " messages; reloading";
      if (selected !== null) select(selected);
    }
  };
}

document.addEventListener("DOMContentLoaded", start);
