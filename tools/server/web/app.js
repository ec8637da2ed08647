// app.js — the moestream app page: conversations (kept in localStorage), each sent whole to
// /v1/chat/completions with stream: true (so the server can reuse the KV cache of the previous
// turn), the streamed reply rendered as markdown (md.js) with its thinking folded away, and
// the live panel polled from /stats while a reply runs.
// Invariant: model output, stored conversations and error messages reach the DOM only as text
// nodes or through md.js (which builds nodes from text); never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const STORE_KEY = "moestream.chats.v1";
const KEY_KEY = "moestream.apiKey";
const STORE_CAP_CHARS = 2000000;  // what the saved conversations may take (localStorage ~5 MB)
const MAX_CHATS = 50;

let chats = [];      // [{id, title, system, messages: [{role, content, reasoning?, finish?}], updated}]
let current = null;  // the chat shown
let active = null;   // the reply being streamed: {chat, msg, view, controller}
let pollTimer = null;
let statsUpdates = 0;
let needKey = false;  // the server answered 401

// ---- small helpers ---------------------------------------------------------------------

function fmt(x, digits) {
  return typeof x === "number" && isFinite(x) ? x.toFixed(digits) : "–";
}
// A setting as a person writes it: 0.7, not 0.699999988 (float32 seen as a double).
function fmtNum(x) {
  return typeof x === "number" && isFinite(x) ? String(Number(x.toPrecision(7))) : String(x);
}
function showError(text) { $("error").textContent = text || ""; }
let noticeKind = "";
function showNotice(text, kind) {
  noticeKind = text ? kind || "" : "";
  $("notice-text").textContent = text || "";
  $("notice").hidden = !text;
}
function storageGet(k) { try { return localStorage.getItem(k); } catch (e) { return null; } }
function storageSet(k, v) {
  try { localStorage.setItem(k, v); return true; } catch (e) { return false; }
}

function apiKey() { return $("set-api-key").value; }
function authHeaders(key = apiKey()) {
  return key ? { Authorization: "Bearer " + key } : {};
}

async function copyText(text, btn) {
  let ok = false;
  try {
    await navigator.clipboard.writeText(text);
    ok = true;
  } catch (e) {  // no clipboard API (not a secure context): the old way
    const ta = document.createElement("textarea");
    ta.value = text;
    document.body.appendChild(ta);
    ta.select();
    try { ok = document.execCommand("copy"); } catch (e2) { ok = false; }
    ta.remove();
  }
  if (btn) {
    const label = btn.textContent;
    btn.textContent = ok ? "Copied" : "Copy failed";
    setTimeout(() => { btn.textContent = label; }, 1500);
  }
}

// ---- thinking -----------------------------------------------------------------------------

// Splits a reply into its thinking and its answer. The thinking is a leading <think>...</think>
// (still open while it streams), or everything before a </think> whose <think> was part of the
// prompt (templates that open the thinking themselves).
function splitThink(content, streaming) {
  const open = content.indexOf("<think>"), close = content.indexOf("</think>");
  if (close >= 0 && (open < 0 || open > close))
    return { think: content.slice(0, close), answer: content.slice(close + 8), open: false };
  if (open >= 0 && content.slice(0, open).trim() === "") {
    const rest = content.slice(open + 7);
    const end = rest.indexOf("</think>");
    if (end < 0) return { think: rest, answer: "", open: true };
    return { think: rest.slice(0, end), answer: rest.slice(end + 8), open: false };
  }
  // The start of a "<think>" still arriving is not shown as text.
  if (streaming && content.trim() !== "" && "<think>".startsWith(content.trim()))
    return { think: "", answer: "", open: false };
  return { think: "", answer: content, open: false };
}
function answerOf(msg) {
  return msg.role === "assistant" ? splitThink(msg.content).answer.replace(/^\s+/, "") : msg.content;
}

// ---- storage --------------------------------------------------------------------------------

function validChat(c) {
  return c && typeof c === "object" && typeof c.id === "string" && Array.isArray(c.messages) &&
    c.messages.every((m) => m && (m.role === "user" || m.role === "assistant") &&
                            typeof m.content === "string");
}

function loadChats() {
  const raw = storageGet(STORE_KEY);
  chats = [];
  if (raw === null) return;
  let parsed = null;
  try { parsed = JSON.parse(raw); } catch (e) { parsed = null; }
  if (!Array.isArray(parsed) || !parsed.every(validChat)) {
    showNotice("The saved conversations in this browser could not be read and were set aside " +
               "(kept as " + STORE_KEY + ".corrupt); starting a new one.", "corrupt");
    storageSet(STORE_KEY + ".corrupt", raw);
    try { localStorage.removeItem(STORE_KEY); } catch (e) { /* storage unavailable */ }
    return;
  }
  chats = parsed.map((c) => ({
    id: c.id, title: typeof c.title === "string" ? c.title : "", system: typeof c.system === "string" ? c.system : "",
    updated: typeof c.updated === "number" ? c.updated : 0,
    messages: c.messages.map((m) => ({ role: m.role, content: m.content,
                                       reasoning: typeof m.reasoning === "string" ? m.reasoning : "",
                                       finish: typeof m.finish === "string" ? m.finish : "",
                                       cutBy: m.cutBy === "context" ? "context" : "max_tokens" })),
  }));
}

// Saves the conversations, newest first: beyond MAX_CHATS or the size cap the oldest ones
// (never the one shown) are dropped; if the one shown alone is over the cap it is not kept.
function saveChats() {
  let list = chats.filter((c) => c.messages.length > 0 || c.system);
  list.sort((a, b) => b.updated - a.updated);
  list = list.filter((c, i) => i < MAX_CHATS || c === current);
  let note = "";
  if (list.includes(current) && JSON.stringify(current).length > STORE_CAP_CHARS) {
    list = list.filter((c) => c !== current);
    note = "This conversation is too long to keep in the browser (over " +
           STORE_CAP_CHARS / 1e6 + " million characters): it will not survive a reload.";
  }
  let text = JSON.stringify(list);
  while (text.length > STORE_CAP_CHARS && list.some((c) => c !== current)) {
    const oldest = list.filter((c) => c !== current).pop();
    list = list.filter((c) => c !== oldest);
    text = JSON.stringify(list);
  }
  if (!storageSet(STORE_KEY, text))
    note = "The browser refused to store the conversations (storage full or disabled): " +
           "they will not survive a reload.";
  if (note) showNotice(note, "storage");
  else if (noticeKind === "storage") showNotice("");
  chats = chats.filter((c) => c === current || list.includes(c));
}

function newChat() {
  const c = { id: Date.now().toString(36) + Math.random().toString(36).slice(2, 8), title: "",
              system: "", messages: [], updated: Date.now() };
  chats.unshift(c);
  return c;
}

function touch(chat) {
  chat.updated = Date.now();
  if (!chat.title) {
    const first = chat.messages.find((m) => m.role === "user");
    if (first) chat.title = first.content.replace(/\s+/g, " ").trim().slice(0, 40);
  }
  saveChats();
  renderChatList();
}

// ---- rendering ------------------------------------------------------------------------------

function renderChatList() {
  const sel = $("chat-list");
  sel.textContent = "";
  const list = chats.slice().sort((a, b) => b.updated - a.updated);
  for (const c of list) {
    const o = document.createElement("option");
    o.value = c.id;
    o.textContent = c.title || "new conversation";
    o.selected = c === current;
    sel.appendChild(o);
  }
}

function button(label, cls, onClick) {
  const b = document.createElement("button");
  b.type = "button";
  b.className = cls;
  b.textContent = label;
  b.addEventListener("click", onClick);
  return b;
}

// The bubble of one message; returns {div, ...parts} for updates while it streams.
function messageView(msg) {
  const div = document.createElement("div");
  div.className = "msg " + msg.role;
  const v = { div, msg };
  if (msg.role === "assistant") {
    v.think = document.createElement("details");
    v.think.className = "think";
    v.thinkSummary = document.createElement("summary");
    v.thinkText = document.createElement("div");
    v.thinkText.className = "think-text";
    v.think.append(v.thinkSummary, v.thinkText);
    v.status = document.createElement("div");
    v.status.className = "status muted";
    div.append(v.think, v.status);
  }
  v.body = document.createElement("div");
  v.body.className = "body";
  v.note = document.createElement("div");
  v.note.className = "note";
  v.actions = document.createElement("div");
  v.actions.className = "actions";
  v.actions.appendChild(button("Copy", "copy-msg", (ev) => copyText(answerOf(msg), ev.target)));
  div.append(v.body, v.note, v.actions);
  updateView(v, false);
  return v;
}

function finishNote(msg) {
  if (msg.finish === "length")
    return msg.cutBy === "context" ? "cut: the context is full" : "cut at max_tokens";
  if (msg.finish === "stopped") return "stopped";
  return "";
}

function updateView(v, streaming) {
  const msg = v.msg;
  if (msg.role !== "assistant") {
    v.body.textContent = msg.content;
    return;
  }
  const parts = splitThink(msg.content, streaming);
  const think = (msg.reasoning || "") + parts.think;
  const thinking = streaming && (parts.open || (think && !parts.answer.trim()));
  v.think.hidden = !think.trim() && !(streaming && parts.open);
  const words = think.trim().split(/\s+/).filter(Boolean).length;
  v.thinkSummary.textContent = (thinking ? "thinking… (" : "thinking (") + words + (words === 1 ? " word)" : " words)");
  v.thinkText.textContent = think.replace(/^\s+/, "");
  v.body.replaceChildren(MoeMarkdown.render(parts.answer.replace(/^\s+/, ""), copyText));
  v.note.textContent = finishNote(msg);
  v.note.hidden = !v.note.textContent;
  v.div.classList.toggle("cut", msg.finish === "length");
}

function atBottom() {
  const m = $("messages");
  return m.scrollHeight - m.clientHeight - m.scrollTop < 40;
}
function toBottom() { $("messages").scrollTop = $("messages").scrollHeight; }

function renderChat() {
  const box = $("messages");
  box.textContent = "";
  for (const msg of current.messages) box.appendChild(messageView(msg).div);
  $("system").value = current.system;
  updateSystemLabel();
  updateRegenerate();
  toBottom();
}

// Regenerate sits on the last reply, when no reply is running.
function updateRegenerate() {
  for (const b of document.querySelectorAll("#messages .regen")) b.remove();
  if (active) return;
  const views = document.querySelectorAll("#messages .msg");
  const last = current.messages[current.messages.length - 1];
  if (!last || last.role !== "assistant" || views.length !== current.messages.length) return;
  views[views.length - 1].querySelector(".actions").appendChild(button("Regenerate", "regen", regenerate));
}

function updateSystemLabel() {
  $("system-label").textContent = current.system.trim() ? "System prompt (set)" : "System prompt";
}

// ---- stats and settings -----------------------------------------------------------------

function setLossy(lossy) {
  const b = $("lossy");
  b.textContent = lossy ? "LOSSY" : "lossless";
  b.className = "badge " + (lossy ? "lossy" : "lossless");
}

// What the running request is doing, as the server reports it.
function phaseText(s) {
  if (!s.generating) return "idle";
  if (s.phase === "prefill")
    return "processing prompt" + (s.n_prompt > 0 ? " (" + s.n_prompt + " tokens)" : "");
  return "generating";
}

function showStats(s) {
  $("stat-state").textContent = phaseText(s);
  $("stat-toks").textContent = fmt(s.tok_s, 2);
  $("stat-hit").textContent = s.cache_budget_mib > 0 ? fmt(s.cache_hit_pct, 1) + " %" : "cache off";
  $("stat-mib").textContent = fmt(s.mib_per_token, 2);
  $("stat-mem").textContent = fmt(s.rss_mib, 0) + " MiB";
  // What the cache holds of its budget, both at the same precision (a budget rounded to whole
  // MiB read as an overrun: "16.3 / 16").
  $("stat-resident").textContent = s.cache_budget_mib > 0
    ? fmt(s.resident_expert_mib, 1) + " of " + fmt(s.cache_budget_mib, 1) + " MiB budget" : "off";
  // Shown only on a server started with --prompt-cache / --warm-experts, once a request ended.
  const pc = s.prompt_cache, warm = s.warm_experts;
  for (const el of document.querySelectorAll("#stats .pcache")) el.hidden = !pc;
  for (const el of document.querySelectorAll("#stats .warm")) el.hidden = !warm;
  if (pc) $("stat-pcache").textContent = pc.tokens_restored + " tokens restored (" +
    fmt(pc.read_mib, 1) + " MiB in " + fmt(pc.restore_s, 2) + " s)";
  if (warm) $("stat-warm").textContent = warm.preloaded + " of " + warm.listed +
    " read (" + warm.before_decode + " before decode), " + warm.not_read + " not read" +
    "; first 16 tokens " + fmt(warm.first16_hit_pct, 1) + " % hits";
  $("stat-tokens").textContent = String(s.n_generated);
  $("stat-queue").textContent = s.queue_waiting + " waiting";
  $("model").textContent = s.model;
  setLossy(s.lossy);
  if (active && active.view && !active.msg.content && !active.msg.reasoning) {
    active.view.status.textContent = s.generating && s.phase === "prefill" ? phaseText(s)
      : s.queue_waiting > 0 && !s.generating ? "waiting in the queue" : active.view.status.textContent;
  }
  statsUpdates += 1;
  $("stats").dataset.updates = String(statsUpdates);
}

async function refreshStats() {
  try {
    const sentKey = apiKey();
    const r = await fetch("/stats", { headers: authHeaders(sentKey) });
    // A 401 refuses the key the request carried: a poll sent before a key was entered is no
    // reason to ask again for the one now in use.
    if (r.status === 401) {
      if (apiKey() === sentKey) askForKey("This server needs an API key.");
      return null;
    }
    if (!r.ok) return null;
    const s = await r.json();
    showStats(s);
    return s;
  } catch (e) {
    return null;
  }
}

async function loadDefaults() {
  const s = await refreshStats();
  if (!s) return;
  const d = s.defaults;
  $("set-temperature").placeholder = fmtNum(d.temperature);
  $("set-max-tokens").placeholder = d.max_tokens === null ? "no limit" : d.max_tokens;
  $("set-max-tokens").max = d.max_tokens_limit;
  $("set-seed").placeholder = d.seed;
  $("set-top-p").placeholder = 1;
  $("set-drop-cold").placeholder = fmtNum(d.drop_cold_experts);
  $("set-drop-cold").disabled = !d.drop_cold_available;
}

// The per-request settings: only fields the user filled in are sent.
function requestSettings() {
  const out = {};
  const num = (id, key, int) => {
    const v = $(id).value.trim();
    if (v === "") return;
    out[key] = int ? parseInt(v, 10) : parseFloat(v);
  };
  num("set-temperature", "temperature", false);
  num("set-max-tokens", "max_tokens", true);
  num("set-seed", "seed", true);
  num("set-top-p", "top_p", false);
  num("set-drop-cold", "drop_cold_experts", false);
  return out;
}

function describeReport(m) {
  const e = m.settings.engine, r = m.settings.request;
  return (m.lossy ? "LOSSY" : "lossless") + ", temperature " + fmtNum(r.temperature) + ", seed " + r.seed +
    ", max_tokens " + r.max_tokens + ", drop-cold " + fmtNum(r.drop_cold_experts) + ", cache " + e.cache_mb +
    " MiB, " + m.stats.n_generated + " tokens at " + fmt(m.stats.decode_tok_s, 2) + " tok/s, " +
    m.stats.n_prompt_reused + " of " + m.stats.n_prompt + " prompt tokens reused";
}

// ---- API key ------------------------------------------------------------------------------

function askForKey(why) {
  needKey = true;
  $("key-why").textContent = why;
  $("key-form").hidden = false;
  $("key-input").focus();
}

$("key-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const key = $("key-input").value.trim();
  if (!key) return;
  $("set-api-key").value = key;
  storageSet(KEY_KEY, key);
  $("key-input").value = "";
  $("key-form").hidden = true;
  showError("");
  const retry = needKey && $("prompt").value.trim() && !active;
  needKey = false;
  loadDefaults();
  if (retry) $("composer").requestSubmit();
});

// ---- sending ------------------------------------------------------------------------------

// Reads an SSE body: calls onEvent(parsed JSON) for each "data:" event until [DONE].
async function readSSE(body, onEvent) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, i);
      buf = buf.slice(i + 2);
      for (const line of ev.split("\n")) {
        if (!line.startsWith("data: ")) continue;  // comments (": waiting") and others
        const data = line.slice(6);
        if (data === "[DONE]") return;
        onEvent(JSON.parse(data));
      }
    }
  }
}

// After a reply ends (or is stopped) the server may still be finishing its last token: poll
// until it is idle, so the live panel does not stay on "generating".
async function refreshUntilIdle() {
  for (let i = 0; i < 25; i++) {
    const s = await refreshStats();
    if (!s || !s.generating) return;
    await new Promise((r) => setTimeout(r, 200));
  }
}

// What the server is sent: the system prompt, then the conversation (replies as generated).
function requestMessages(chat) {
  const out = [];
  if (chat.system.trim()) out.push({ role: "system", content: chat.system });
  for (const m of chat.messages) out.push({ role: m.role, content: m.content });
  return out;
}

class HttpError extends Error {
  constructor(status, msg) { super(msg); this.status = status; }
}

// Streams a reply to the conversation as it stands. On failure undo() puts things back.
async function streamReply(chat, undo) {
  showError("");
  const messages = requestMessages(chat);
  const msg = { role: "assistant", content: "", reasoning: "", finish: "" };
  chat.messages.push(msg);
  const view = messageView(msg);
  view.div.classList.add("streaming");
  view.div.setAttribute("aria-busy", "true");  // screen readers: announce the reply when done
  view.status.textContent = "waiting for the server";
  $("messages").appendChild(view.div);
  toBottom();
  const me = { chat, msg, view, controller: new AbortController() };
  active = me;
  updateRegenerate();
  $("send").disabled = true;
  $("stop").disabled = false;
  pollTimer = setInterval(refreshStats, 400);
  let frame = 0;
  const redraw = () => {
    frame = 0;
    const follow = atBottom();
    if (msg.content || msg.reasoning) view.status.textContent = "";
    updateView(view, true);
    if (follow) toBottom();
  };
  const sentKey = apiKey();
  try {
    const body = Object.assign({ messages, stream: true }, requestSettings());
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: Object.assign({ "Content-Type": "application/json" }, authHeaders(sentKey)),
      body: JSON.stringify(body),
      signal: me.controller.signal,
    });
    if (!r.ok) {
      let msgText = r.status + " " + r.statusText;
      try { msgText += ": " + (await r.json()).error.message; } catch (e) { /* not JSON */ }
      throw new HttpError(r.status, msgText);
    }
    await readSSE(r.body, (ev) => {
      if (ev.error) throw new Error(ev.error.message);
      const c = ev.choices && ev.choices[0];
      const d = c && c.delta;
      if (d && typeof d.reasoning_content === "string") msg.reasoning += d.reasoning_content;
      if (d && typeof d.content === "string") msg.content += d.content;
      if (c && c.finish_reason) {
        msg.finish = c.finish_reason === "length" ? "length" : c.finish_reason;
        const req = ev.moestream && ev.moestream.settings && ev.moestream.settings.request;
        const used = ev.usage && ev.usage.completion_tokens;
        if (msg.finish === "length")
          msg.cutBy = req && typeof req.max_tokens === "number" && used >= req.max_tokens ? "max_tokens" : "context";
      }
      if (ev.moestream) {
        $("last-settings").textContent = describeReport(ev.moestream);
        setLossy(ev.moestream.lossy);
      }
      if (!frame) frame = requestAnimationFrame(redraw);
    });
    if (msg.finish === "stop") msg.finish = "";
  } catch (e) {
    if (e.name === "AbortError") {
      msg.finish = "stopped";
      // The server's report of a stopped reply never comes: say what this request asked for.
      const asked = requestSettings();
      $("last-settings").textContent = "stopped before the end; asked for " +
        (Object.keys(asked).length ? Object.entries(asked).map(([k, v]) => k + " " + v).join(", ") : "the server's defaults");
    } else {
      // Not answered: the reply leaves the conversation and undo() restores what was there.
      chat.messages.splice(chat.messages.indexOf(msg), 1);
      view.div.remove();
      undo();
      showError(String(e.message || e));
      if (e.status === 401 && apiKey() === sentKey) askForKey("This server needs an API key: " + e.message);
    }
  } finally {
    if (frame) cancelAnimationFrame(frame);
    view.div.classList.remove("streaming");
    view.div.removeAttribute("aria-busy");
    view.status.textContent = "";
    if (chat.messages.includes(msg)) {
      const follow = atBottom();
      updateView(view, false);
      if (follow) toBottom();
    }
    clearInterval(pollTimer);
    active = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    touch(chat);
    updateRegenerate();
    refreshUntilIdle();
  }
}

function send(text) {
  const chat = current;
  const user = { role: "user", content: text };
  chat.messages.push(user);
  const uv = messageView(user);
  $("messages").appendChild(uv.div);
  touch(chat);
  return streamReply(chat, () => {
    chat.messages.splice(chat.messages.indexOf(user), 1);
    uv.div.remove();
    if (!$("prompt").value) $("prompt").value = text;
  });
}

// Replaces the last reply with a new one (the old one comes back if the new one fails).
function regenerate() {
  if (active) return;
  const chat = current;
  const old = chat.messages[chat.messages.length - 1];
  if (!old || old.role !== "assistant") return;
  chat.messages.pop();
  const views = document.querySelectorAll("#messages .msg");
  const oldDiv = views[views.length - 1];
  oldDiv.remove();
  streamReply(chat, () => {
    chat.messages.push(old);
    $("messages").appendChild(oldDiv);
  });
}

// Leaves the conversation shown (a running reply is stopped and kept as it is).
function switchTo(chat) {
  if (active) active.controller.abort();
  current = chat;
  showError("");
  renderChat();
  renderChatList();
}

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || active) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => { if (active) active.controller.abort(); });
$("clear").addEventListener("click", () => {
  const empty = current.messages.length === 0 && !active;
  switchTo(empty ? current : newChat());
});
$("chat-list").addEventListener("change", () => {
  const c = chats.find((x) => x.id === $("chat-list").value);
  if (c && c !== current) switchTo(c);
});
$("delete-chat").addEventListener("click", () => {
  if (active) active.controller.abort();
  chats = chats.filter((c) => c !== current);
  const next = chats.slice().sort((a, b) => b.updated - a.updated)[0];
  current = next || newChat();
  saveChats();
  renderChat();
  renderChatList();
});
$("notice-close").addEventListener("click", () => showNotice(""));
$("system").addEventListener("input", () => {
  current.system = $("system").value;
  updateSystemLabel();
});
$("system").addEventListener("change", () => touch(current));
$("set-api-key").addEventListener("change", () => {
  storageSet(KEY_KEY, apiKey());
  loadDefaults();
});

// ---- start ----------------------------------------------------------------------------------

$("set-api-key").value = storageGet(KEY_KEY) || "";
loadChats();
current = chats.slice().sort((a, b) => b.updated - a.updated)[0] || newChat();
renderChat();
renderChatList();
loadDefaults();
