// browser_chat.mjs URL KEY_URL KEY ARTIFACT_DIR HOLD_FILE — drives the moestream app page in Debian's
// chromium (playwright-core, no browser download). URL: a server without an API key (default
// temperature 0.7, a prompt held in prefill while HOLD_FILE exists:
// MOESTREAM_DEBUG_PREFILL_HOLD); KEY_URL: one that needs KEY. At a phone-sized viewport:
//   1. load the page; the stats panel shows the server's settings (0.7, not float noise, also
//      in /props);
//   2. send a message; the assistant's text grows while the reply streams, and the live stats
//      panel updates during generation (state "generating", tokens counting up); held in its
//      prefill, the server's /stats says "prefill" with the prompt's size, then "decode";
//   3. model output that looks like HTML is shown as text: the SSE reply of one request is
//      replaced (page.route) by one carrying markup, which must appear literally, creating no
//      elements;
//   4. no horizontal overflow at 390 px; screenshots saved to ARTIFACT_DIR;
//   5. New chat during a reply: the next request carries only the new conversation;
//   6. Stop: the live panel comes back to "idle";
//   7. a failed send leaves no empty bubble (and gives the text back);
//   8. a long reply on the phone: the composer stays on screen, the box follows the reply;
//   9. markdown: the renderer's cases (md.js, exact DOM) and a planted reply mixing markdown
//      with <script>, <img onerror> and javascript: links (text only, no element from markup);
//      a code block's Copy; a 400-character code line and a 30-column table scroll inside the
//      bubble (no page overflow at 390 px);
//  10. <think> and reasoning_content fold into a closed "thinking" section;
//  11. the system prompt is the first message of the request (the real server answers);
//  12. Regenerate replaces the last reply; Copy puts a message's text on the clipboard;
//  13. finish_reason "length" (max tokens 3 on the real server) shows "cut at max_tokens";
//  14. prefill: while /stats says phase "prefill", the page says "processing prompt (N tokens)";
//      the expert cache is shown against its budget at one precision ("16.3 of 16.4 MiB budget");
//  15. reload keeps the conversations (and the system prompt); corrupt storage gives a notice;
//  17. at 1280x800, 768x1024 and 390x844 after 10 turns: Send, Stop, New chat, temperature and
//      max tokens on screen, the page not scrolled; Regenerate sends the page's temperature 0.7;
//      /favicon.ico served;
// and at a desktop viewport against KEY_URL:
//  16. the API key prompt appears on 401; with the key entered the message goes, as Bearer, and
//      the key is kept across a reload; markdown and a folded <think> at this size too.
// Exits non-zero with a message on the first failed check.
import { chromium } from "playwright-core";
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";

const [url, keyUrl, theKey, artDir, holdFile] = process.argv.slice(2);
const t0 = Date.now();
const log = (...a) => console.log("browser_chat:", ((Date.now() - t0) / 1000).toFixed(1) + "s", ...a);
// Polls the server's /stats until pred holds; the 60 s bound only catches a hang.
async function statsUntil(pred, what) {
  for (const end = Date.now() + 60000; ;) {
    const s = await (await fetch(url + "stats")).json();
    if (pred(s)) return s;
    assert.ok(Date.now() < end, `no ${what} in /stats within 60 s: ${JSON.stringify(s)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
let failed = false;
const phone = await browser.newContext({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
await phone.grantPermissions(["clipboard-read", "clipboard-write"], { origin: new URL(url).origin });
const page = await phone.newPage();
page.on("pageerror", (e) => { failed = true; console.error("page error:", e.message); });
try {
  await page.goto(url);
  await page.waitForFunction(() => document.getElementById("model").textContent.length > 0);
  assert.match(await page.textContent("#lossy"), /LOSSY|lossless/);
  assert.equal(await page.getAttribute("#set-temperature", "placeholder"), "0.7", "the default temperature as given");
  const props = await (await fetch(url + "props")).json();
  assert.equal(props.default_generation_settings.temperature, 0.7, "/props: temperature 0.7, not its float32 noise");
  log("page loaded, model", await page.textContent("#model"));

  // 2. a streamed reply, watched mid-generation.
  const updatesBefore = Number(await page.getAttribute("#stats", "data-updates"));
  // The server holds the prompt in its prefill while HOLD_FILE exists (the test releases it):
  // /stats must say "prefill" (with the prompt's size, no token yet) in that state, whatever the
  // machine's load, then "decode" once released.
  fs.writeFileSync(holdFile, "");
  const hello = "Hello <b>there</b> " + "tell me more about it. ".repeat(14);
  await page.fill("#prompt", hello);
  await page.click("#send");
  const held = await statsUntil((s) => s.phase !== "idle", "a generation");
  const heldAgain = await statsUntil(() => true, "/stats");
  fs.unlinkSync(holdFile);
  // Once decoding began, /stats never says prefill again.
  const phases = [];
  let polling = true;
  const poller = (async () => {
    while (polling) {
      const s = await (await fetch(url + "stats")).json();
      phases.push([s.phase, s.n_prompt, s.n_generated]);
      await new Promise((r) => setTimeout(r, 5));
    }
  })();
  const userText = await page.textContent(".msg.user .body");
  assert.equal(userText, hello, "the user's message is shown as text");
  // Text appears while the bubble is still streaming ...
  await page.waitForFunction(() => {
    const m = document.querySelector(".msg.assistant.streaming .body");
    return m && m.textContent.length > 0;
  }, null, { timeout: 60000 });
  const early = await page.textContent(".msg.assistant .body");
  // ... and the stats panel says "generating" with a token count, before the reply is done.
  await page.waitForFunction(() =>
    document.querySelector(".msg.assistant.streaming") &&
    document.getElementById("stat-state").textContent === "generating" &&
    Number(document.getElementById("stat-tokens").textContent) > 0, null, { timeout: 60000 });
  const midTokens = Number(await page.textContent("#stat-tokens"));
  await page.screenshot({ path: path.join(artDir, "browser-chat-streaming.png") });
  await page.waitForSelector(".msg.assistant:not(.streaming)", { timeout: 120000 });
  const full = await page.textContent(".msg.assistant .body");
  assert.ok(full.length > early.length, `the reply grew while streaming (${early.length} -> ${full.length} chars)`);
  const updatesAfter = Number(await page.getAttribute("#stats", "data-updates"));
  assert.ok(updatesAfter - updatesBefore >= 3, `stats panel updated during generation (${updatesAfter - updatesBefore} updates)`);
  await page.waitForFunction(() => document.getElementById("stat-state").textContent === "idle");
  const endTokens = Number(await page.textContent("#stat-tokens"));
  assert.ok(endTokens > midTokens, `token count went up (${midTokens} mid-generation, ${endTokens} at the end)`);
  assert.match(await page.textContent("#stat-toks"), /^\d+\.\d\d$/);
  assert.match(await page.textContent("#stat-hit"), /%|cache off/);
  assert.ok(await page.isHidden("#stat-pcache") && await page.isHidden("#stat-warm"),
            "no prompt cache or warm set on this server: their rows are hidden");
  assert.match(await page.textContent("#stat-mib"), /^\d+\.\d\d$/);
  assert.match(await page.textContent("#stat-mem"), /MiB$/);
  assert.match(await page.textContent("#last-settings"), /LOSSY|lossless/);
  assert.equal(await page.textContent("#error"), "");
  polling = false;
  await poller;
  const nPrompt = Number((await page.textContent("#last-settings")).match(/of (\d+) prompt tokens/)[1]);
  assert.deepEqual([held.phase, held.n_prompt, held.n_generated], ["prefill", nPrompt, 0],
                   "held: /stats says prefill, n_prompt " + nPrompt + ", no token yet");
  assert.equal(heldAgain.phase, "prefill", "still prefill while held");
  // Negative control: released, the same generation reaches decode (phase is not stuck).
  const firstDecode = phases.findIndex((p) => p[0] === "decode");
  assert.ok(firstDecode >= 0, "/stats said decode after the release: " + JSON.stringify(phases.slice(0, 12)));
  assert.ok(phases.slice(firstDecode).every((p) => p[0] !== "prefill"), "no prefill after decoding began");
  log(`/stats phases: prefill while held (n_prompt ${nPrompt}), then decode`);
  log(`streamed ${endTokens} tokens; seen mid-generation at ${midTokens}; ${updatesAfter - updatesBefore} stats updates`);

  // 3. HTML in model output stays text.
  const evil = '<img src=x onerror="window.__pwned=1"><b id="bold">bold</b>';
  await page.route("**/v1/chat/completions", (route) => {
    const chunk = (delta, finish) => "data: " + JSON.stringify({ choices: [{ index: 0, delta, finish_reason: finish }] }) + "\n\n";
    route.fulfill({ status: 200, contentType: "text/event-stream",
                    body: chunk({ role: "assistant", content: "" }, null) + chunk({ content: evil }, null) +
                          chunk({}, "stop") + "data: [DONE]\n\n" });
  });
  await page.fill("#prompt", "show me markup");
  await page.click("#send");
  await page.waitForFunction(() => document.querySelectorAll(".msg.assistant:not(.streaming)").length === 2);
  const last = page.locator(".msg.assistant .body").nth(1);
  assert.equal(await last.textContent(), evil, "markup in model output is shown literally");
  assert.equal(await page.locator("#messages img, #messages b").count(), 0, "no element was created from output");
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
  await page.unroute("**/v1/chat/completions");

  const fakeReply = (text, deltas = []) => {
    const chunk = (delta, finish) => "data: " + JSON.stringify({ choices: [{ index: 0, delta, finish_reason: finish }] }) + "\n\n";
    return chunk({ role: "assistant", content: "" }, null) + deltas.map((d) => chunk(d, null)).join("") +
           chunk({ content: text }, null) + chunk({}, "stop") + "data: [DONE]\n\n";
  };
  // Answers the next chat requests with `reply` (a string or a function of the request body and
  // its number); returns the list of request bodies seen.
  const plant = async (reply) => {
    const seen = [];
    await page.route("**/v1/chat/completions", (route) => {
      const body = JSON.parse(route.request().postData());
      seen.push(body);
      const r = typeof reply === "function" ? reply(body, seen.length) : reply;
      route.fulfill({ status: 200, contentType: "text/event-stream", body: r.startsWith("data: ") ? r : fakeReply(r) });
    });
    return seen;
  };
  const unplant = () => page.unroute("**/v1/chat/completions");
  const nDone = (n) => page.waitForFunction((k) => document.querySelectorAll(".msg.assistant:not(.streaming)").length === k &&
                                             !document.getElementById("send").disabled, n, { timeout: 60000 });
  const waitStreaming = () => page.waitForFunction(() => {
    const m = document.querySelector(".msg.assistant.streaming .body");
    return m && m.textContent.length > 0;
  }, null, { timeout: 60000 });
  const waitIdleButtons = () => page.waitForFunction(() => !document.getElementById("send").disabled, null, { timeout: 60000 });

  // 5. New chat while a reply streams: the old partial reply must not reach the next request.
  await page.click("#clear");
  await page.fill("#prompt", "first conversation");
  await page.click("#send");
  await waitStreaming();
  await page.click("#clear");
  await waitIdleButtons();
  let sent = null;
  await page.route("**/v1/chat/completions", (route) => {
    sent = JSON.parse(route.request().postData());
    route.fulfill({ status: 200, contentType: "text/event-stream", body: fakeReply("new reply") });
  });
  await page.fill("#prompt", "second conversation");
  await page.click("#send");
  await page.waitForFunction(() => document.querySelectorAll(".msg.assistant:not(.streaming)").length === 1);
  await page.unroute("**/v1/chat/completions");
  assert.deepEqual(sent.messages, [{ role: "user", content: "second conversation" }],
                   "New chat starts an empty conversation");
  log("New chat during a reply: the next request holds only the new conversation");

  // 6. Stop mid-reply: the panel must not stay on "generating".
  await page.fill("#prompt", "a reply to stop");
  await page.click("#send");
  await waitStreaming();
  await page.click("#stop");
  await waitIdleButtons();
  await page.waitForFunction(() => document.getElementById("stat-state").textContent === "idle", null, { timeout: 5000 });
  log("Stop: the live panel is back to idle");

  // 7. A failed send: no empty bubble is left, the text goes back to the box.
  await page.click("#clear");
  await page.route("**/v1/chat/completions", (route) =>
    route.fulfill({ status: 500, contentType: "application/json",
                    body: JSON.stringify({ error: { message: "planted failure", code: 500 } }) }));
  await page.fill("#prompt", "this one fails");
  await page.click("#send");
  await page.waitForFunction(() => document.getElementById("error").textContent.includes("planted failure"));
  await page.unroute("**/v1/chat/completions");
  assert.equal(await page.locator(".msg").count(), 0, "no bubble of an unanswered turn is left");
  assert.equal(await page.inputValue("#prompt"), "this one fails", "the text is given back");
  await page.fill("#prompt", "");
  log("failed send: no empty bubble, text restored");

  // 8. A long reply on the phone: the composer stays visible and the box follows the reply.
  const longText = Array.from({ length: 300 }, (_, i) => "line " + i).join("\n");
  await page.route("**/v1/chat/completions", (route) =>
    route.fulfill({ status: 200, contentType: "text/event-stream", body: fakeReply(longText) }));
  await page.fill("#prompt", "a long one");
  await page.click("#send");
  await page.waitForFunction(() => document.querySelectorAll(".msg.assistant:not(.streaming)").length === 1);
  await page.unroute("**/v1/chat/completions");
  const box = await page.locator("#send").boundingBox();
  const vh = page.viewportSize().height;
  assert.ok(box && box.y >= 0 && box.y + box.height <= vh, `the composer is on screen (send at y ${box && box.y}, viewport ${vh})`);
  const follow = await page.evaluate(() => { const m = document.getElementById("messages"); return m.scrollHeight - m.clientHeight - m.scrollTop; });
  assert.ok(follow <= 2, `the message box shows the end of the reply (${follow} px below)`);
  log("long reply: composer on screen, box at the end");
  await page.click("#clear");

  // 9. Markdown: the renderer's cases (exact DOM), then a planted reply mixing markdown and markup.
  const mdCases = [
    ["# Title\n\nSome *em* and **strong** and `a<b>` code.",
     '<h3 class="md-h1">Title</h3><p>Some <em>em</em> and <strong>strong</strong> and <code>a&lt;b&gt;</code> code.</p>'],
    ["- a\n- b\n\n1. x\n2. y", "<ul><li>a</li><li>b</li></ul><ol><li>x</li><li>y</li></ol>"],
    ["- a\n  - b\n- c", "<ul><li>a<ul><li>b</li></ul></li><li>c</li></ul>"],
    ["```js\nlet a = 1 < 2;\n```\nafter",
     '<div class="codeblock"><div class="codehead"><span>js</span><button type="button" class="copy-code">Copy</button></div>' +
     "<pre><code>let a = 1 &lt; 2;</code></pre></div><p>after</p>"],
    ["```\nstill streaming", '<div class="codeblock"><div class="codehead"><span>code</span><button type="button" class="copy-code">Copy</button></div><pre><code>still streaming</code></pre></div>'],
    ["[site](https://example.com/a?b=1) [x](javascript:void0) [y](data:text/html,hi)",
     '<p><a href="https://example.com/a?b=1" rel="noopener noreferrer" target="_blank">site</a> [x](javascript:void0) [y](data:text/html,hi)</p>'],
    ["see https://x.org/p.", '<p>see <a href="https://x.org/p" rel="noopener noreferrer" target="_blank">https://x.org/p</a>.</p>'],
    ["a <b>c</b> snake_case_name\nnext line", "<p>a &lt;b&gt;c&lt;/b&gt; snake_case_name<br>next line</p>"],
    ["> quoted *text*", "<blockquote><p>quoted <em>text</em></p></blockquote>"],
    ["| a | b |\n|---|--:|\n| 1 | 2 |",
     '<div class="md-table"><table><thead><tr><th>a</th><th style="text-align: right;">b</th></tr></thead>' +
     '<tbody><tr><td>1</td><td style="text-align: right;">2</td></tr></tbody></table></div>'],
    ["~~old~~ __new__ ---\n\n***", "<p><del>old</del> <strong>new</strong> ---</p><hr>"],
    ["\\*not em\\* 2 \\< 3 `a\\b`", "<p>*not em* 2 &lt; 3 <code>a\\b</code></p>"],
  ];
  const mdOut = await page.evaluate((cases) => cases.map(([src]) => {
    const d = document.createElement("div");
    d.appendChild(MoeMarkdown.render(src));
    return d.innerHTML;
  }), mdCases);
  mdCases.forEach(([src, want], i) => assert.equal(mdOut[i], want, "markdown of " + JSON.stringify(src)));
  log(`markdown: ${mdCases.length} renderer cases`);

  await page.click("#clear");
  const evil2 = "**bold** then <script>window.__pwned2=1</script> and <img src=x onerror=\"window.__pwned2=1\">\n\n" +
                "```html\n<img src=x onerror=alert(1)>\n```\n[click](javascript:window.__pwned2=1) <a href=\"javascript:x\">a</a>";
  await plant(evil2);
  await page.fill("#prompt", "markdown and markup");
  await page.click("#send");
  await nDone(1);
  await unplant();
  const evilBody = page.locator(".msg.assistant .body");
  assert.equal(await evilBody.locator("strong").textContent(), "bold", "markdown is rendered");
  assert.equal(await evilBody.locator("pre code").textContent(), "<img src=x onerror=alert(1)>");
  assert.ok((await evilBody.textContent()).includes("<script>window.__pwned2=1</script>"), "the script tag is shown as text");
  assert.equal(await page.locator("#messages script, #messages img, #messages a").count(), 0,
               "no element was created from markup in the output");
  assert.equal(await page.evaluate(() => window.__pwned2), undefined);
  await page.click(".msg.assistant .copy-code");
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), "<img src=x onerror=alert(1)>", "the code block's Copy");
  assert.ok(await page.isHidden(".msg.assistant .note"), "a reply that ended by itself has no cut sign");
  log("markdown in a reply rendered; <script>, <img onerror> and javascript: links stayed text");
  // Wide markdown (a long code line, a wide table) scrolls inside the bubble, not the page.
  const wide = "```\n" + "x".repeat(400) + "\n```\n\n| " + Array.from({ length: 30 }, (_, i) => "column" + i).join(" | ") +
               " |\n|" + "---|".repeat(30) + "\n| " + "1 | ".repeat(30);
  await plant(wide);
  await page.fill("#prompt", "wide output");
  await page.click("#send");
  await nDone(2);
  await unplant();
  assert.equal(await page.locator(".msg.assistant >> nth=1 >> table th").count(), 30);
  const wideOverflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(wideOverflow <= 0, `wide markdown: no page overflow at 390 px (${wideOverflow} px)`);
  log("wide code and tables scroll within the bubble");

  // 10. Thinking folds.
  await plant((body, n) => n === 1
    ? fakeReply("The answer is **42**.", [{ content: "<think>" }, { content: "secret reasoning" }, { content: "</think>\n\n" }])
    : fakeReply("Plain answer", [{ reasoning_content: "step one" }]));
  await page.fill("#prompt", "think first");
  await page.click("#send");
  await nDone(3);
  await page.fill("#prompt", "reasoning field");
  await page.click("#send");
  await nDone(4);
  await unplant();
  const thinks = page.locator(".msg.assistant .think");
  assert.ok(await thinks.nth(0).isHidden(), "no thinking section for a reply without thinking");
  for (const [i, secret, answer] of [[2, "secret reasoning", "The answer is 42."], [3, "step one", "Plain answer"]]) {
    const t = thinks.nth(i);
    assert.ok(await t.isVisible(), "a thinking section");
    assert.equal(await t.getAttribute("open"), null, "folded");
    assert.match(await t.locator("summary").textContent(), /^thinking/);
    assert.ok(await t.locator(".think-text").isHidden(), "its text is not shown while folded");
    assert.equal(await t.locator(".think-text").textContent(), secret);
    assert.equal(await page.locator(".msg.assistant .body").nth(i).textContent(), answer, "the answer without the thinking");
  }
  await thinks.nth(2).locator("summary").click();
  assert.ok(await thinks.nth(2).locator(".think-text").isVisible(), "a click unfolds it");
  await page.screenshot({ path: path.join(artDir, "browser-chat-markdown.png"), fullPage: true });
  log("thinking (<think> and reasoning_content) folded");

  // 11. System prompt (the real server answers), 12. Regenerate and Copy.
  await page.click("#clear");
  await page.click("#system-label");
  await page.fill("#system", "You are terse.");
  const sysReq = page.waitForRequest("**/v1/chat/completions");
  await page.fill("#prompt", "hi");
  await page.click("#send");
  const sysBody = JSON.parse((await sysReq).postData());
  assert.deepEqual(sysBody.messages, [{ role: "system", content: "You are terse." }, { role: "user", content: "hi" }],
                   "the system prompt is sent first");
  await nDone(1);
  log("system prompt: reply done");
  assert.match(await page.textContent("#last-settings"), /of \d+ prompt tokens/);
  const realReply = await page.textContent(".msg.assistant .body");
  assert.ok(realReply.length > 0);
  assert.equal(await page.locator(".regen").count(), 1, "Regenerate on the last reply");
  const regenSeen = await plant("second take");
  await page.click(".regen");
  await nDone(1);
  await unplant();
  assert.deepEqual(regenSeen[0].messages, sysBody.messages, "Regenerate sends the conversation without the old reply");
  assert.equal(await page.locator(".msg").count(), 2);
  assert.equal(await page.textContent(".msg.assistant .body"), "second take", "the reply was replaced");
  log("regenerated");
  await page.click(".msg.assistant .copy-msg");
  assert.equal(await page.evaluate(() => navigator.clipboard.readText()), "second take", "Copy puts the reply's text on the clipboard");
  log("system prompt sent first; Regenerate replaced the reply; Copy copied it");

  // 13. A reply cut by max_tokens (the real server, max tokens 3).
  await page.fill("#set-max-tokens", "3");
  await page.fill("#prompt", "a long story please");
  await page.click("#send");
  await nDone(2);
  await page.fill("#set-max-tokens", "");
  const cutNote = page.locator(".msg.assistant .note").nth(1);
  assert.equal(await cutNote.textContent(), "cut at max_tokens");
  assert.ok(await cutNote.isVisible());
  log("finish_reason length: 'cut at max_tokens' shown");

  // 14. Prefill: while /stats says "prefill", the page says the prompt is being processed.
  await page.route("**/stats", async (route) => {
    try {
      const real = await (await route.fetch()).json();
      await route.fulfill({ json: Object.assign(real, { generating: true, phase: "prefill", n_prompt: 1234, n_generated: 0,
                                                        resident_expert_mib: 16.3, cache_budget_mib: 16.44 }) });
    } catch (e) { /* unrouted meanwhile */ }
  });
  // The reply is held until the page has shown the prefill state, then released.
  let releaseReply;
  const prefillShown = new Promise((r) => { releaseReply = r; });
  await page.route("**/v1/chat/completions", async (route) => {
    await prefillShown;
    route.fulfill({ status: 200, contentType: "text/event-stream", body: fakeReply("after the prefill") });
  });
  await page.fill("#prompt", "a long prompt");
  await page.click("#send");
  try {
    await page.waitForFunction(() => {
      const st = document.querySelector(".msg.assistant.streaming .status");
      return st && st.textContent === "processing prompt (1234 tokens)" &&
             document.getElementById("stat-state").textContent === "processing prompt (1234 tokens)";
    }, null, { timeout: 60000 });
  } finally {
    releaseReply();
  }
  // The expert cache against its budget at one precision: 16.3 MiB of a 16.44 MiB budget is not
  // shown as "16.3 / 16" (an overrun it is not).
  assert.equal(await page.textContent("#stat-resident"), "16.3 of 16.4 MiB budget");
  await nDone(3);
  await page.unroute("**/stats");
  await unplant();
  const realStats = await (await fetch(url + "stats")).json();
  assert.equal(realStats.phase, "idle");
  assert.ok(realStats.n_prompt > 0, "the server reports the last prompt's size");
  log("prefill: 'processing prompt (N tokens)' shown while the server is in its prefill");

  // 15. Reload keeps the conversation; corrupt storage is a notice, not a crash.
  const before = await page.locator("#messages .body").allTextContents();
  const nChats = await page.locator("#chat-list option").count();
  await page.reload();
  await page.waitForFunction(() => document.getElementById("model").textContent.length > 0);
  assert.deepEqual(await page.locator("#messages .body").allTextContents(), before, "the conversation is back");
  assert.equal(await page.inputValue("#system"), "You are terse.", "with its system prompt");
  assert.equal(await page.locator("#chat-list option").count(), nChats, "and the other conversations");
  assert.equal(await page.textContent(".msg.assistant .note >> nth=1"), "cut at max_tokens");
  assert.ok(await page.isHidden("#notice"));
  // Over the size cap: the conversation is not stored, and the page says so.
  await page.click("#clear");
  await page.evaluate(() => {
    const s = document.getElementById("system");
    s.value = "x".repeat(2100000);
    s.dispatchEvent(new Event("input"));
    s.dispatchEvent(new Event("change"));
  });
  assert.match(await page.textContent("#notice"), /too long to keep/);
  const storedSystems = await page.evaluate(() => JSON.parse(localStorage.getItem("moestream.chats.v1")).map((c) => c.system.length));
  assert.ok(storedSystems.every((n) => n < 100), "the over-cap conversation was not stored, the others were");
  assert.equal(storedSystems.length, nChats, "the other conversations are still stored");
  await page.click("#notice-close");
  assert.ok(await page.isHidden("#notice"));
  await page.click("#delete-chat");
  await page.evaluate(() => localStorage.setItem("moestream.chats.v1", '[{"id": 1, "messages": "no"'));
  await page.reload();
  await page.waitForFunction(() => document.getElementById("model").textContent.length > 0);
  assert.match(await page.textContent("#notice"), /could not be read/);
  assert.equal(await page.locator(".msg").count(), 0);
  await plant("fresh start");
  await page.fill("#prompt", "after corruption");
  await page.click("#send");
  await nDone(1);
  await unplant();
  assert.equal(await page.evaluate(() => JSON.parse(localStorage.getItem("moestream.chats.v1")).length), 1,
               "storage works again");
  log("reload kept the conversation; corrupt storage gave a notice");

  // 4. phone-sized layout: nothing wider than the screen.
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `no horizontal overflow at 390 px (${overflow} px)`);
  await page.screenshot({ path: path.join(artDir, "browser-chat.png"), fullPage: true });
  assert.ok(!failed, "no JavaScript error on the page");

  // 17. At 1280x800, 768x1024 and 390x844, after 10 turns: Send, Stop and New chat are on
  // screen (the page itself does not scroll: only the message box does); temperature (the
  // page's 0.7) and max tokens sit by the message box, and Regenerate sends that temperature;
  // the icon is served.
  for (const viewport of [{ width: 1280, height: 800 }, { width: 768, height: 1024 }, { width: 390, height: 844 }]) {
    const p = await browser.newPage({ viewport });
    p.on("pageerror", (e) => { failed = true; console.error("page error (" + viewport.width + "):", e.message); });
    const bodies = [];
    await p.route("**/v1/chat/completions", (route) => {
      bodies.push(route.request().postDataJSON());
      route.fulfill({ status: 200, contentType: "text/event-stream",
        body: fakeReply(Array.from({ length: 6 }, (_, i) => "reply line " + i).join("\n\n")) });
    });
    await p.goto(url);
    await p.waitForFunction(() => document.getElementById("model").textContent.length > 0);
    for (let i = 0; i < 10; i++) {
      await p.fill("#prompt", "turn " + i);
      await p.click("#send");
      await p.waitForFunction((n) => document.querySelectorAll(".msg.assistant:not(.streaming)").length === n, i + 1);
    }
    for (const id of ["#send", "#stop", "#clear", "#composer #set-temperature", "#composer #set-max-tokens"]) {
      const b = await p.locator(id).boundingBox();
      assert.ok(b && b.y >= 0 && b.y + b.height <= viewport.height,
        `${id} on screen at ${viewport.width}x${viewport.height} after 10 turns (y ${b && b.y})`);
    }
    assert.equal(await p.evaluate(() => window.scrollY), 0, "the page did not scroll");
    assert.equal(await p.inputValue("#set-temperature"), "0.7");
    await p.click(".msg.assistant:last-child .regen");
    await p.waitForFunction(() => document.querySelectorAll(".msg.assistant:not(.streaming)").length === 10);
    assert.equal(bodies.length, 11);
    assert.equal(bodies[10].temperature, 0.7, "Regenerate at the page's temperature");
    assert.equal(bodies[0].temperature, 0.7, "every send carries it");
    await p.screenshot({ path: path.join(artDir, "browser-chat-10-turns-" + viewport.width + ".png") });
    await p.close();
  }
  const icon = await fetch(url + "favicon.ico");
  assert.equal(icon.status, 200, "/favicon.ico");
  assert.match(icon.headers.get("content-type"), /image\/svg\+xml/);
  log("10 turns at three sizes: composer on screen; temperature 0.7 by the box, sent by Regenerate; icon served");

  // 16. Desktop, a server with an API key: the page asks for it on 401, then the send works.
  const desk = await browser.newPage({ viewport: { width: 1280, height: 800 } });
  desk.on("pageerror", (e) => { failed = true; console.error("page error (desktop):", e.message); });
  const deskSeen = [];
  desk.on("request", (r) => { if (r.url().endsWith("/v1/chat/completions")) deskSeen.push(r.headers()["authorization"] || ""); });
  await desk.goto(keyUrl);
  await desk.waitForSelector("#key-form:not([hidden])", { timeout: 10000 });
  assert.match(await desk.textContent("#key-why"), /API key/);
  // The poll that follows the refused send carries no key: it is held here and answered (401)
  // only once the key is entered. A refusal of the key a request carried must not ask again
  // for the key now in use (the form stays hidden below).
  let releaseStale, onStaleHeld;
  const staleReleased = new Promise((res) => { releaseStale = res; });
  const staleHeld = new Promise((res) => { onStaleHeld = res; });
  let staleTaken = false;
  await desk.route(/\/stats$/, async (route) => {
    if (!staleTaken && !route.request().headers()["authorization"]) {
      staleTaken = true;
      onStaleHeld();
      await staleReleased;
    }
    await route.continue();
  });
  await desk.fill("#prompt", "hello with a key");
  await desk.click("#send");
  await desk.waitForFunction(() => document.getElementById("error").textContent.includes("401"), null, { timeout: 10000 });
  assert.equal(await desk.locator(".msg").count(), 0, "the refused turn leaves no bubble");
  assert.equal(await desk.inputValue("#prompt"), "hello with a key");
  await staleHeld;
  await desk.fill("#key-input", theKey);
  await desk.click("#key-form button");
  const staleAnswer = desk.waitForResponse((r) => r.url().endsWith("/stats") && r.status() === 401);
  releaseStale();
  await staleAnswer;
  await desk.waitForFunction(() => document.querySelectorAll(".msg.assistant:not(.streaming)").length === 1 &&
                             document.querySelector(".msg.assistant .body").textContent.length > 0, null, { timeout: 60000 });
  assert.ok(await desk.isHidden("#key-form"), "the key prompt is gone once the key works");
  // This server has --prompt-cache and --warm-experts: once the request ended, /stats carries
  // both and the page shows them (control: the open server's page hides both rows, above).
  await desk.waitForFunction(() => /tokens restored \(/.test(document.getElementById("stat-pcache").textContent) &&
                             / read \(\d+ before decode\), \d+ not read; first 16 tokens .* % hits/.test(document.getElementById("stat-warm").textContent),
                             null, { timeout: 30000 });
  assert.ok(await desk.isVisible("#stat-pcache") && await desk.isVisible("#stat-warm"));
  assert.deepEqual(deskSeen, ["", "Bearer " + theKey], "first without a key (401), then with it");
  assert.equal(await desk.evaluate(() => localStorage.getItem("moestream.apiKey")), theKey, "the key is kept");
  await desk.waitForFunction(() => !document.getElementById("send").disabled);
  await desk.reload();
  await desk.waitForFunction(() => document.getElementById("model").textContent.length > 0, null, { timeout: 10000 });
  assert.ok(await desk.isHidden("#key-form"), "after a reload the stored key is used");
  assert.equal(await desk.locator(".msg.assistant").count(), 1, "the conversation survived the reload");
  // Markdown and thinking at this size too.
  await desk.route("**/v1/chat/completions", (route) => route.fulfill({
    status: 200, contentType: "text/event-stream",
    body: fakeReply("## Plan\n\n1. **one**\n2. `two`\n\n```sh\necho <b>\n```", [{ content: "<think>hidden</think>" }]) }));
  await desk.fill("#prompt", "markdown on a desktop");
  await desk.click("#send");
  await desk.waitForFunction(() => document.querySelectorAll(".msg.assistant:not(.streaming)").length === 2);
  await desk.unroute("**/v1/chat/completions");
  const deskLast = desk.locator(".msg.assistant").nth(1);
  assert.equal(await deskLast.locator(".body h4").textContent(), "Plan");
  assert.deepEqual(await deskLast.locator(".body ol li").allTextContents(), ["one", "two"]);
  assert.equal(await deskLast.locator(".body pre code").textContent(), "echo <b>");
  assert.equal(await deskLast.locator(".body b").count(), 0);
  assert.ok(await deskLast.locator(".think-text").isHidden(), "thinking folded");
  const deskOverflow = await desk.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(deskOverflow <= 0, `no horizontal overflow at 1280 px (${deskOverflow} px)`);
  await desk.screenshot({ path: path.join(artDir, "browser-chat-desktop.png") });
  log("desktop: API key asked on 401, stored, sent as Bearer; the reply came");
  assert.ok(!failed, "no JavaScript error on the pages");
  log("ok; screenshots in", artDir);

} catch (e) {
  failed = true;
  console.error("browser_chat: FAILED:", e.message);
  await page.screenshot({ path: path.join(artDir, "browser-chat-failure.png"), fullPage: true }).catch(() => {});
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
