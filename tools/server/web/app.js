// app.js — the moestream app page: sends the conversation to /v1/chat/completions with
// stream: true, appends the streamed text as it arrives, polls /stats while generating.
// Invariant: model output and error messages are only ever inserted as text (textContent /
// text nodes), never as HTML. The conversation lives in this page only (`history`); sending
// it whole lets the server reuse the KV cache of the previous turn.
"use strict";

const $ = (id) => document.getElementById(id);
const history = [];
let controller = null;
let pollTimer = null;
let conversation = 0;  // New chat bumps it: what an older conversation's reply does is dropped
let statsUpdates = 0;

function authHeaders() {
  const key = $("set-api-key").value;
  return key ? { Authorization: "Bearer " + key } : {};
}

function fmt(x, digits) {
  return typeof x === "number" && isFinite(x) ? x.toFixed(digits) : "–";
}

function showError(text) {
  $("error").textContent = text || "";
}

function addMessage(role, text) {
  const div = document.createElement("div");
  div.className = "msg " + role;
  div.appendChild(document.createTextNode(text));
  $("messages").appendChild(div);
  $("messages").scrollTop = $("messages").scrollHeight;
  return div;
}

function setLossy(lossy) {
  const b = $("lossy");
  b.textContent = lossy ? "LOSSY" : "lossless";
  b.className = "badge " + (lossy ? "lossy" : "lossless");
}

function showStats(s) {
  $("stat-state").textContent = s.generating ? "generating" : "idle";
  $("stat-toks").textContent = fmt(s.tok_s, 2);
  $("stat-hit").textContent = s.cache_budget_mib > 0 ? fmt(s.cache_hit_pct, 1) + " %" : "cache off";
  $("stat-mib").textContent = fmt(s.mib_per_token, 2);
  $("stat-mem").textContent = fmt(s.rss_mib, 0) + " MiB";
  $("stat-resident").textContent = fmt(s.resident_expert_mib, 1) + " / " + fmt(s.cache_budget_mib, 0) + " MiB";
  $("stat-tokens").textContent = String(s.n_generated);
  $("stat-queue").textContent = s.queue_waiting + " waiting";
  $("model").textContent = s.model;
  setLossy(s.lossy);
  statsUpdates += 1;
  $("stats").dataset.updates = String(statsUpdates);
}

async function refreshStats() {
  try {
    const r = await fetch("/stats", { headers: authHeaders() });
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
  $("set-temperature").placeholder = d.temperature;
  $("set-max-tokens").placeholder = d.max_tokens === null ? "no limit" : d.max_tokens;
  $("set-max-tokens").max = d.max_tokens_limit;
  $("set-seed").placeholder = d.seed;
  $("set-top-p").placeholder = 1;
  $("set-drop-cold").placeholder = d.drop_cold_experts;
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
  return (m.lossy ? "LOSSY" : "lossless") + ", temperature " + r.temperature + ", seed " + r.seed +
    ", max_tokens " + r.max_tokens + ", drop-cold " + r.drop_cold_experts + ", cache " + e.cache_mb +
    " MiB, " + m.stats.n_generated + " tokens at " + fmt(m.stats.decode_tok_s, 2) + " tok/s, " +
    m.stats.n_prompt_reused + " of " + m.stats.n_prompt + " prompt tokens reused";
}

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

async function send(text) {
  showError("");
  const conv = conversation;
  history.push({ role: "user", content: text });
  const userDiv = addMessage("user", text);
  const div = addMessage("assistant", "");
  div.classList.add("streaming");
  const textNode = div.firstChild;
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  pollTimer = setInterval(refreshStats, 400);
  let reply = "";
  try {
    const body = Object.assign({ messages: history, stream: true }, requestSettings());
    const r = await fetch("/v1/chat/completions", {
      method: "POST",
      headers: Object.assign({ "Content-Type": "application/json" }, authHeaders()),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!r.ok) {
      let msg = r.status + " " + r.statusText;
      try { msg += ": " + (await r.json()).error.message; } catch (e) { /* not JSON */ }
      throw new Error(msg);
    }
    await readSSE(r.body, (ev) => {
      if (ev.error) throw new Error(ev.error.message);
      const c = ev.choices && ev.choices[0];
      if (c && c.delta && typeof c.delta.content === "string" && c.delta.content) {
        reply += c.delta.content;
        textNode.appendData(c.delta.content);
        $("messages").scrollTop = $("messages").scrollHeight;
      }
      if (ev.moestream) {
        $("last-settings").textContent = describeReport(ev.moestream);
        setLossy(ev.moestream.lossy);
      }
    });
    if (conv === conversation) history.push({ role: "assistant", content: reply });
  } catch (e) {
    if (conv !== conversation) {
      // New chat during the reply: nothing of the old conversation is kept.
    } else if (e.name === "AbortError") {
      history.push({ role: "assistant", content: reply });
      showError("stopped");
    } else {
      // Not answered: the turn leaves the conversation and its text goes back to the box.
      history.pop();
      div.remove();
      userDiv.remove();
      if (!$("prompt").value) $("prompt").value = text;
      showError(String(e.message || e));
    }
  } finally {
    div.classList.remove("streaming");
    clearInterval(pollTimer);
    controller = null;
    $("send").disabled = false;
    $("stop").disabled = true;
    refreshUntilIdle();
  }
}

$("composer").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const text = $("prompt").value;
  if (!text.trim() || controller) return;
  $("prompt").value = "";
  send(text);
});
$("prompt").addEventListener("keydown", (ev) => {
  if (ev.key === "Enter" && !ev.shiftKey) {
    ev.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => { if (controller) controller.abort(); });
$("clear").addEventListener("click", () => {
  conversation++;
  if (controller) controller.abort();
  history.length = 0;
  $("messages").textContent = "";
  showError("");
});
$("set-api-key").addEventListener("change", loadDefaults);

loadDefaults();
