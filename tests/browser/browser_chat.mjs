// browser_chat.mjs URL ARTIFACT_DIR — drives the moestream app page in Debian's chromium
// (playwright-core, no browser download) at a phone-sized viewport:
//   1. load the page; the stats panel shows the server's settings;
//   2. send a message; the assistant's text grows while the reply streams, and the live stats
//      panel updates during generation (state "generating", tokens counting up);
//   3. model output that looks like HTML is shown as text: the SSE reply of one request is
//      replaced (page.route) by one carrying markup, which must appear literally, creating no
//      elements;
//   4. no horizontal overflow at 390 px; screenshots saved to ARTIFACT_DIR;
//   5. New chat during a reply: the next request carries only the new conversation;
//   6. Stop: the live panel comes back to "idle";
//   7. a failed send leaves no empty bubble (and gives the text back);
//   8. a long reply on the phone: the composer stays on screen, the box follows the reply.
// Exits non-zero with a message on the first failed check.
import { chromium } from "playwright-core";
import assert from "node:assert/strict";
import path from "node:path";

const [url, artDir] = process.argv.slice(2);
const log = (...a) => console.log("browser_chat:", ...a);

const browser = await chromium.launch({
  executablePath: "/usr/bin/chromium",
  headless: true,
  args: ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"],
});
let failed = false;
const page = await browser.newPage({ viewport: { width: 390, height: 844 }, isMobile: true, hasTouch: true });
page.on("pageerror", (e) => { failed = true; console.error("page error:", e.message); });
try {
  await page.goto(url);
  await page.waitForFunction(() => document.getElementById("model").textContent.length > 0);
  assert.match(await page.textContent("#lossy"), /LOSSY|lossless/);
  log("page loaded, model", await page.textContent("#model"));

  // 2. a streamed reply, watched mid-generation.
  const updatesBefore = Number(await page.getAttribute("#stats", "data-updates"));
  await page.fill("#prompt", "Hello <b>there</b>");
  await page.click("#send");
  const userText = await page.textContent(".msg.user");
  assert.equal(userText, "Hello <b>there</b>", "the user's message is shown as text");
  // Text appears while the bubble is still streaming ...
  await page.waitForFunction(() => {
    const m = document.querySelector(".msg.assistant.streaming");
    return m && m.textContent.length > 0;
  }, null, { timeout: 60000 });
  const early = await page.textContent(".msg.assistant");
  // ... and the stats panel says "generating" with a token count, before the reply is done.
  await page.waitForFunction(() =>
    document.querySelector(".msg.assistant.streaming") &&
    document.getElementById("stat-state").textContent === "generating" &&
    Number(document.getElementById("stat-tokens").textContent) > 0, null, { timeout: 60000 });
  const midTokens = Number(await page.textContent("#stat-tokens"));
  await page.screenshot({ path: path.join(artDir, "browser-chat-streaming.png") });
  await page.waitForSelector(".msg.assistant:not(.streaming)", { timeout: 120000 });
  const full = await page.textContent(".msg.assistant");
  assert.ok(full.length > early.length, `the reply grew while streaming (${early.length} -> ${full.length} chars)`);
  const updatesAfter = Number(await page.getAttribute("#stats", "data-updates"));
  assert.ok(updatesAfter - updatesBefore >= 3, `stats panel updated during generation (${updatesAfter - updatesBefore} updates)`);
  await page.waitForFunction(() => document.getElementById("stat-state").textContent === "idle");
  const endTokens = Number(await page.textContent("#stat-tokens"));
  assert.ok(endTokens > midTokens, `token count went up (${midTokens} mid-generation, ${endTokens} at the end)`);
  assert.match(await page.textContent("#stat-toks"), /^\d+\.\d\d$/);
  assert.match(await page.textContent("#stat-hit"), /%|cache off/);
  assert.match(await page.textContent("#stat-mib"), /^\d+\.\d\d$/);
  assert.match(await page.textContent("#stat-mem"), /MiB$/);
  assert.match(await page.textContent("#last-settings"), /LOSSY|lossless/);
  assert.equal(await page.textContent("#error"), "");
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
  const last = page.locator(".msg.assistant").nth(1);
  assert.equal(await last.textContent(), evil, "markup in model output is shown literally");
  assert.equal(await page.locator("#messages img, #messages b").count(), 0, "no element was created from output");
  assert.equal(await page.evaluate(() => window.__pwned), undefined);
  await page.unroute("**/v1/chat/completions");

  const fakeReply = (text) => {
    const chunk = (delta, finish) => "data: " + JSON.stringify({ choices: [{ index: 0, delta, finish_reason: finish }] }) + "\n\n";
    return chunk({ role: "assistant", content: "" }, null) + chunk({ content: text }, null) +
           chunk({}, "stop") + "data: [DONE]\n\n";
  };
  const waitStreaming = () => page.waitForFunction(() => {
    const m = document.querySelector(".msg.assistant.streaming");
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

  // 4. phone-sized layout: nothing wider than the screen.
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
  assert.ok(overflow <= 0, `no horizontal overflow at 390 px (${overflow} px)`);
  await page.screenshot({ path: path.join(artDir, "browser-chat.png"), fullPage: true });
  assert.ok(!failed, "no JavaScript error on the page");
  log("ok; screenshots in", artDir);
} catch (e) {
  failed = true;
  console.error("browser_chat: FAILED:", e.message);
  await page.screenshot({ path: path.join(artDir, "browser-chat-failure.png"), fullPage: true }).catch(() => {});
} finally {
  await browser.close();
}
process.exit(failed ? 1 : 0);
