// api_test.mjs — `moestream serve` through the official openai SDK (run by run.sh):
// stop strings, penalties, context clamping, refusal by name, cancellation by disconnect,
// slow-header connections against /health, and SIGTERM ending a stream. Every check has a
// control: the same request without the feature behaves as the baseline.
// Tools and reasoning run on TOOLS_URL and HARMONY_URL, servers whose models carry a
// Hermes/Qwen3-style and a gpt-oss harmony-style template: a synth model never chooses a tool
// by itself, so the calls are forced (tool_choice named, enforced by a grammar) and replies
// with thinking are fixed by a grammar.
// Usage: node api_test.mjs FAST_URL SLOW_URL SLOW_PID TOOLS_URL HARMONY_URL REAL_URLS
// (REAL_URLS: "key=url,..." for the real-template servers of run.sh)
import assert from "node:assert/strict";
import http from "node:http";
import net from "node:net";
import { readFileSync } from "node:fs";
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import { Ajv } from "ajv";
import addFormatsModule from "ajv-formats";
import { models as zodModels } from "./zod_models.mjs";

const [fastUrl, slowUrl, slowPid, toolsUrl, harmonyUrl] = process.argv.slice(2);
const fast = new OpenAI({ baseURL: fastUrl + "v1", apiKey: "none", maxRetries: 0 });
const slow = new OpenAI({ baseURL: slowUrl + "v1", apiKey: "none", maxRetries: 0 });
const tooled = new OpenAI({ baseURL: toolsUrl + "v1", apiKey: "none", maxRetries: 0 });
const harmony = new OpenAI({ baseURL: harmonyUrl + "v1", apiKey: "none", maxRetries: 0 });

let failed = 0;
async function check(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    console.log(`ok   ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failed++;
    console.log(`FAIL ${name}: ${e.stack || e}`);
  }
}

// The synth model's vocabulary is one token per byte: every multi-character string spans
// tokens. A grammar makes its output known in advance.
const SENTENCE = "hello world, hello moon";
const fixed = { grammar: `root ::= "${SENTENCE}"` };

async function refusedWith(promise, param) {
  try {
    await promise;
  } catch (e) {
    assert.equal(e.status, 400, `status of ${param}: ${e.message}`);
    assert.equal(e.error?.param ?? e.param, param, e.message);
    return e;
  }
  assert.fail(`'${param}' was accepted`);
}

await check("stop string across tokens (completions)", async () => {
  const base = await fast.completions.create({ model: "m", prompt: "Say", max_tokens: 40, ...fixed });
  assert.equal(base.choices[0].text, SENTENCE, "control: the grammar's sentence");
  const r = await fast.completions.create({ model: "m", prompt: "Say", max_tokens: 40, stop: ["o w", "zz"], ...fixed });
  assert.equal(r.choices[0].text, "hell");
  assert.equal(r.choices[0].finish_reason, "stop");
  assert.equal(r.moestream.stop_string, "o w");
});

await check("stop string while streaming (chat)", async () => {
  const stream = await fast.chat.completions.create({
    model: "m", messages: [{ role: "user", content: "Say" }], max_tokens: 40, stream: true,
    stop: "lo m", ...fixed,
  });
  let text = "", finish = null;
  for await (const c of stream) {
    text += c.choices[0]?.delta?.content ?? "";
    finish = c.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(text, "hello world, hel");
  assert.equal(finish, "stop");
});

await check("penalties change the output", async () => {
  const req = { model: "m", prompt: "Once upon a time", max_tokens: 24, temperature: 0 };
  const base = (await fast.completions.create(req)).choices[0].text;
  const off = (await fast.completions.create({ ...req, frequency_penalty: 0 })).choices[0].text;
  assert.equal(off, base, "control: a zero penalty changes nothing");
  for (const extra of [{ frequency_penalty: 2 }, { presence_penalty: 2 }, { repeat_penalty: 2 }]) {
    const t = (await fast.completions.create({ ...req, ...extra })).choices[0].text;
    assert.notEqual(t, base, JSON.stringify(extra));
  }
});

await check("max_tokens over the context is clamped with finish_reason length", async () => {
  const prompt = "x".repeat(500);  // 500 tokens of the 512-token context
  const r = await fast.completions.create({ model: "m", prompt, max_tokens: 4000, ignore_eos: true });
  assert.equal(r.choices[0].finish_reason, "length");
  assert.equal(r.usage.total_tokens, 512);
  const small = await fast.completions.create({ model: "m", prompt, max_tokens: 3, ignore_eos: true });
  assert.equal(small.usage.completion_tokens, 3, "control: a request that fits is not clamped");
  const e = await refusedWith(fast.completions.create({ model: "m", prompt: "x".repeat(600), max_tokens: 1 }), "prompt");
  assert.match(e.message, /longer than the context \(512 tokens\)/);
});

await check("unsupported fields are refused by name", async () => {
  const msgs = [{ role: "user", content: "hi" }];
  const ok = await fast.chat.completions.create({ model: "m", messages: msgs, max_tokens: 2 });
  assert.equal(ok.choices.length, 1, "control: the plain request is served");
  assert.match(ok.moestream.settings.request.chat_template, /chatml/);
  await refusedWith(fast.chat.completions.create({ model: "m", messages: msgs, max_tokens: 2,
    response_format: { type: "json_schema", json_schema: { name: "x", schema: { type: "string", pattern: "a(?=b)" } } } }), "response_format");
  await refusedWith(fast.chat.completions.create({ model: "m", messages: msgs, max_tokens: 2,
    tools: [{ type: "function", function: { name: "f", parameters: { type: "object" } } }] }), "tools");
  await refusedWith(fast.chat.completions.create({ model: "m", messages: msgs, max_tokens: 2, n: 2 }), "n");
  await refusedWith(fast.chat.completions.create({ model: "m", messages: msgs, max_tokens: 2, logprobs: true, top_logprobs: 21 }), "top_logprobs");
  await refusedWith(fast.chat.completions.create({ model: "m", messages: msgs, max_tokens: 2, mirostat: 2 }), "mirostat");
  await refusedWith(fast.completions.create({ model: "m", prompt: "x", max_tokens: 2, logprobs: 21 }), "logprobs");
});

await check("parse() with a json_schema returns an object of the schema", async () => {
  const schema = {
    type: "object",
    properties: { name: { type: "string", maxLength: 3 }, age: { type: "integer" }, kind: { enum: ["a", "b"] } },
    required: ["name", "age", "kind"], additionalProperties: false,
  };
  const isPerson = (v) => v !== null && typeof v === "object" && !Array.isArray(v) &&
    Object.keys(v).join() === "name,age,kind" && typeof v.name === "string" &&
    Number.isInteger(v.age) && (v.kind === "a" || v.kind === "b");
  let parsed = 0;
  for (const seed of [1, 2, 3, 4, 5]) {
    const req = { model: "m", messages: [{ role: "user", content: "a person" }], max_tokens: 80, temperature: 1, seed };
    try {
      const r = await fast.chat.completions.parse({ ...req,
        response_format: { type: "json_schema", json_schema: { name: "person", strict: true, schema } } });
      assert.ok(isPerson(r.choices[0].message.parsed), JSON.stringify(r.choices[0].message));
      parsed++;
    } catch (e) {
      if (e.constructor.name !== "LengthFinishReasonError") throw e;  // cut at max_tokens
    }
    const plain = await fast.chat.completions.create({ ...req, max_tokens: 30 });
    let v = null;
    try { v = JSON.parse(plain.choices[0].message.content); } catch { /* not JSON */ }
    assert.ok(!isPerson(v), "control: without the schema the model writes no such object");
  }
  assert.ok(parsed > 0, "some replies end by themselves and parse");
});

await check(`parse() with zod: ${zodModels.length} ordinary models, every finished reply valid by ajv`, async () => {
  const ajv = new Ajv({ strict: false, allErrors: true });
  (addFormatsModule.default ?? addFormatsModule)(ajv);
  for (const m of zodModels) {
    const format = zodResponseFormat(m.schema, m.name.replace(/\W/g, "_"));
    const valid = ajv.compile(format.json_schema.schema);
    // Controls: the validators refuse an instance that breaks one bound, and a reply
    // written without the schema.
    assert.equal(valid(m.bad), false, `${m.name}: ajv refuses ${JSON.stringify(m.bad)}`);
    assert.equal(m.schema.safeParse(m.bad).success, false, `${m.name}: zod refuses the bad instance`);
    let finished = 0;
    for (const seed of [1, 2, 3, 4]) {
      const req = { model: "m", messages: [{ role: "user", content: `a ${m.name}` }], max_tokens: 300,
        temperature: 1, seed };
      let r;
      try {
        r = await fast.chat.completions.parse({ ...req, response_format: format });  // zod parses it too
      } catch (e) {
        if (e.constructor.name === "LengthFinishReasonError") continue;  // cut at max_tokens
        throw new Error(`${m.name}, seed ${seed}: ${e.message}`);
      }
      const v = r.choices[0].message.parsed;
      assert.ok(valid(JSON.parse(r.choices[0].message.content)),
        `${m.name}, seed ${seed}: ${r.choices[0].message.content}: ${ajv.errorsText(valid.errors)}`);
      assert.ok(v !== null && typeof v === "object", m.name);
      finished++;
      if (finished === 2) break;
    }
    assert.ok(finished > 0, `${m.name}: some replies end by themselves`);
    if (m === zodModels[0]) {
      const plain = await fast.chat.completions.create({ model: "m", messages: [{ role: "user", content: "a person" }],
        max_tokens: 60, temperature: 1, seed: 1 });
      let v = null;
      try { v = JSON.parse(plain.choices[0].message.content); } catch { /* not JSON */ }
      assert.equal(valid(v), false, "control: without the schema the reply is no such object");
    }
  }
});

// pydantic's own schemas (tests/api/pydantic_models.py, Debian's python3-pydantic 1.10: there
// is no v2 package) sent as response_format json_schema; each finished reply valid by ajv.
// Control: ajv refuses each model's bad instance (pydantic refused it when the file was made).
const pydanticModels = JSON.parse(readFileSync(process.env.MOESTREAM_PYDANTIC_MODELS, "utf8"));
await check(`pydantic: ${pydanticModels.length} ordinary models, every finished reply valid by ajv`, async () => {
  assert.ok(pydanticModels.length >= 8);
  const ajv = new Ajv({ strict: false, allErrors: true });
  (addFormatsModule.default ?? addFormatsModule)(ajv);
  for (const m of pydanticModels) {
    const valid = ajv.compile(m.schema);
    assert.equal(valid(m.bad), false, `${m.name}: ajv refuses ${JSON.stringify(m.bad)}`);
    let finished = 0;
    for (const seed of [1, 2, 3, 4, 5, 6]) {  // (an email's local part can be long: 500 tokens)
      const r = await fast.chat.completions.create({ model: "m", messages: [{ role: "user", content: `a ${m.name}` }],
        max_tokens: 500, temperature: 1, seed,
        response_format: { type: "json_schema", json_schema: { name: "m", schema: m.schema, strict: true } } });
      if (r.choices[0].finish_reason === "length") continue;  // cut at max_tokens
      const text = r.choices[0].message.content;
      assert.ok(valid(JSON.parse(text)), `${m.name}, seed ${seed}: ${text}: ${ajv.errorsText(valid.errors)}`);
      finished++;
      break;
    }
    assert.ok(finished > 0, `${m.name}: some replies end by themselves`);
  }
});

await check("logprobs: the OpenAI shapes, sane values, streaming too", async () => {
  const req = { model: "m", messages: [{ role: "user", content: "Count" }], max_tokens: 10, ignore_eos: true,
    logprobs: true, top_logprobs: 4, cache_prompt: false };
  const r = await fast.chat.completions.create(req);
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, 10);
  let bytes = [];
  for (const e of content) {
    assert.equal(typeof e.token, "string");
    assert.ok(e.logprob <= 0);
    assert.equal(e.top_logprobs.length, 4);
    const lps = e.top_logprobs.map((t) => t.logprob);
    assert.deepEqual(lps, [...lps].sort((a, b) => b - a), "most likely first");
    assert.ok(lps.reduce((a, l) => a + Math.exp(l), 0) <= 1 + 1e-5);
    assert.equal(e.top_logprobs[0].logprob, e.logprob, "greedy: the most likely token");
    bytes = bytes.concat(e.bytes);
  }
  assert.equal(content.length, r.usage.completion_tokens);
  const text = r.choices[0].message.content;  // (Node and the server replace broken UTF-8 differently)
  if (!text.includes("\ufffd")) assert.equal(Buffer.from(bytes).toString("utf8"), text);
  const off = await fast.chat.completions.create({ ...req, logprobs: false, top_logprobs: undefined });
  assert.equal(off.choices[0].logprobs, null, "control: none when not asked");
  const stream = await fast.chat.completions.create({ ...req, stream: true });
  const streamed = [];
  for await (const c of stream) streamed.push(...(c.choices[0]?.logprobs?.content ?? []));
  assert.deepEqual(streamed, content);
  const c = await fast.completions.create({ model: "m", prompt: "Count", max_tokens: 6, ignore_eos: true, logprobs: 2, cache_prompt: false });
  const l = c.choices[0].logprobs;
  assert.equal(l.tokens.length, 6);
  assert.equal(l.token_logprobs.length, 6);
  assert.equal(l.top_logprobs.length, 6);
  assert.equal(l.text_offset[0], 0);
  for (let i = 1; i < 6; i++) assert.ok(l.text_offset[i] > l.text_offset[i - 1], "byte offsets grow");
  for (const [i, t] of l.tokens.entries()) assert.ok(t in l.top_logprobs[i] && Object.keys(l.top_logprobs[i]).length <= 3);
});

const weather = {
  name: "get_weather", description: "Current weather in a city",
  parameters: { type: "object", properties: { city: { type: "string", enum: ["Paris", "Rome"] } },
                required: ["city"] },
};
const forceWeather = { type: "function", function: { name: "get_weather" } };
// With thinking on, a forced call may follow a thinking block, which a synth model never
// closes: the Hermes checks of the call turn thinking off.
const noThink = { chat_template_kwargs: { enable_thinking: false } };

async function applyTemplate(url, body) {
  const r = await fetch(url + "apply-template", { method: "POST",
    headers: { "Content-Type": "application/json" }, body: JSON.stringify(body) });
  assert.equal(r.status, 200, await r.clone().text());
  return r.json();
}

// runTools with a forced get_weather call: the first completion holds exactly that call, and
// the SDK ran the tool with a city of the enum. Returns the completion and the messages after.
async function forcedWeatherRound(client, template, extra, messages) {
  let calledWith = null;
  const runner = client.chat.completions.runTools({
    model: "m", max_tokens: 200, tool_choice: forceWeather, ...extra, messages,
    tools: [{ type: "function", function: { ...weather, parse: JSON.parse,
      function: async (args) => { calledWith = args; return { temp_c: 21 }; } } }],
  });
  const first = await runner.finalChatCompletion();
  const c = first.choices[0];
  assert.equal(c.finish_reason, "tool_calls");
  assert.equal(c.message.content, null);
  assert.equal(c.message.tool_calls.length, 1);
  assert.equal(c.message.tool_calls[0].function.name, "get_weather");
  assert.ok(["Paris", "Rome"].includes(calledWith?.city), `the tool ran with ${JSON.stringify(calledWith)}`);
  assert.match(first.moestream.settings.request.chat_template, template);
  return { first, c, msgs: runner.messages.map(({ parsed, ...m }) => m) };
}

await check("runTools: a forced call runs the tool, its result goes back, a final answer arrives", async () => {
  const { first, c, msgs } = await forcedWeatherRound(tooled, /^hermes \(the model's template, minja\)/,
    { parallel_tool_calls: false, ...noThink }, [{ role: "user", content: "Weather in Paris?" }]);
  assert.deepEqual(msgs.map((m) => m.role), ["user", "assistant", "tool"]);
  assert.equal(msgs[2].tool_call_id, c.message.tool_calls[0].id);
  // The tool's result, in the model's syntax, is in the next prompt.
  const tools = [{ type: "function", function: weather }];
  const t = await applyTemplate(toolsUrl, { messages: msgs, tools });
  assert.ok(t.prompt.includes('<tool_response>\n{"temp_c":21}\n</tool_response>'), t.prompt.slice(-300));
  assert.ok(t.prompt.includes('<tool_call>\n{"name": "get_weather", "arguments": {"city": "'), "the call as the template prints it");
  const final = await tooled.chat.completions.create({ model: "m", messages: msgs, tools,
    tool_choice: "none", max_tokens: 40, ...fixed });
  assert.equal(final.choices[0].message.content, SENTENCE);
  assert.equal(final.choices[0].finish_reason, "stop");
  assert.equal(final.choices[0].message.tool_calls, undefined, "control: no call without a forced one");
  assert.ok(final.usage.prompt_tokens > first.usage.prompt_tokens, "the round trip is in the prompt");
});

await check("a forced call streams as delta.tool_calls", async () => {
  const s = tooled.chat.completions.stream({ model: "m", max_tokens: 200, parallel_tool_calls: false,
    tool_choice: forceWeather, messages: [{ role: "user", content: "Rome?" }], ...noThink,
    tools: [{ type: "function", function: weather }] });
  let deltas = 0;
  for await (const chunk of s) if (chunk.choices[0]?.delta?.tool_calls) deltas++;
  const done = await s.finalChatCompletion();
  assert.ok(deltas >= 1, "tool_calls deltas");
  assert.equal(done.choices[0].finish_reason, "tool_calls");
  const call = done.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, "get_weather");
  assert.ok(["Paris", "Rome"].includes(JSON.parse(call.function.arguments).city));
});

await check("parallel_tool_calls false with tool_choice auto: the generation ends after the first call", async () => {
  const one = '<tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": {\\"city\\": \\"Rome\\"}}\\n</tool_call>';
  const body = { model: "m", max_tokens: 200, messages: [{ role: "user", content: "Rome?" }], ...noThink,
    tools: [{ type: "function", function: weather }], grammar: `root ::= "${one}\\n${one}"` };
  const two = await tooled.chat.completions.create(body);
  assert.equal(two.choices[0].message.tool_calls.length, 2, "control: both calls with parallel calls allowed");
  const r = await tooled.chat.completions.create({ ...body, parallel_tool_calls: false });
  assert.equal(r.choices[0].message.tool_calls.length, 1);
  assert.equal(r.choices[0].finish_reason, "tool_calls");
  assert.equal(r.moestream.stats.finish, "tool_call");
  assert.ok(r.usage.completion_tokens < two.usage.completion_tokens, "the second call was not generated");
  const s = await tooled.chat.completions.create({ ...body, parallel_tool_calls: false, stream: true });
  let deltas = 0;
  for await (const chunk of s) deltas += chunk.choices[0]?.delta?.tool_calls?.length ?? 0;
  assert.equal(deltas, 1);
});

await check("tools on a template without tool syntax are refused naming it", async () => {
  const e = await refusedWith(fast.chat.completions.create({ model: "m", max_tokens: 2,
    messages: [{ role: "user", content: "hi" }], tools: [{ type: "function", function: weather }] }), "tools");
  assert.match(e.message, /tools are not supported by this model's chat template \(chatml/);
});

await check("thinking goes to reasoning_content; enable_thinking false turns it off", async () => {
  const think = { grammar: `root ::= "<think>\\nI should greet.\\n</think>\\n\\n${SENTENCE}"` };
  const msgs = [{ role: "user", content: "hi" }];
  const on = await tooled.chat.completions.create({ model: "m", messages: msgs, max_tokens: 80, ...think });
  assert.equal(on.choices[0].message.reasoning_content, "I should greet.");
  assert.equal(on.choices[0].message.content, SENTENCE);
  const s = await tooled.chat.completions.create({ model: "m", messages: msgs, max_tokens: 80, stream: true, ...think });
  let r = "", txt = "";
  for await (const chunk of s) {
    r += chunk.choices[0]?.delta?.reasoning_content ?? "";
    txt += chunk.choices[0]?.delta?.content ?? "";
  }
  assert.equal(r, "I should greet.");
  assert.equal(txt, SENTENCE);
  const off = await tooled.chat.completions.create({ model: "m", messages: msgs, max_tokens: 80,
    chat_template_kwargs: { enable_thinking: false }, ...think });
  assert.equal(off.choices[0].message.reasoning_content, undefined, "control: no thinking block expected");
  assert.match(off.choices[0].message.content, /^<think>/);
  assert.ok((await applyTemplate(toolsUrl, { messages: msgs, chat_template_kwargs: { enable_thinking: false } }))
    .prompt.endsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
});

// gpt-oss harmony: the synth model writes bytes, so a forced call's first choice (an analysis
// message or the call, "<|channel|>a..." or "<|channel|>c...") is steered to the call by a
// bias against the byte "a" (where the grammar allows only "a", it is still taken).
async function noAnalysis(url) {
  const r = await fetch(url + "tokenize", { method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ content: "a" }) });
  const ids = (await r.json()).tokens;
  return { [ids[ids.length - 1]]: -100 };
}

await check("harmony: runTools round trip, the call and its result in the model's syntax", async () => {
  const { msgs } = await forcedWeatherRound(harmony, /^harmony/, { logit_bias: await noAnalysis(harmonyUrl) },
    [{ role: "system", content: "Be brief." }, { role: "user", content: "Weather in Paris?" }]);
  assert.deepEqual(msgs.map((m) => m.role), ["system", "user", "assistant", "tool"]);
  const tools = [{ type: "function", function: weather }];
  const t = await applyTemplate(harmonyUrl, { messages: msgs, tools });
  assert.ok(t.prompt.includes("type get_weather = (_: {\ncity: \"Paris\" | \"Rome\",\n}) => any;"), t.prompt);
  assert.ok(t.prompt.includes("<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \""),
            "the call as the template prints it");
  assert.ok(t.prompt.endsWith('<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>{"temp_c":21}<|end|><|start|>assistant'),
            t.prompt.slice(-200));
  // The answer: an analysis message, then the final channel (fixed by a grammar).
  const answer = { grammar: `root ::= "<|channel|>analysis<|message|>It is 21.<|end|><|start|>assistant<|channel|>final<|message|>${SENTENCE}"` };
  const final = await harmony.chat.completions.create({ model: "m", messages: msgs, tools,
    tool_choice: "none", max_tokens: 120, ...answer });
  assert.equal(final.choices[0].message.content, SENTENCE);
  assert.equal(final.choices[0].message.reasoning_content, "It is 21.");
  assert.equal(final.choices[0].finish_reason, "stop");
  assert.equal(final.choices[0].message.tool_calls, undefined);
  // Streamed: the analysis as reasoning_content deltas, the final channel as content.
  const s = await harmony.chat.completions.create({ model: "m", messages: msgs, tools,
    tool_choice: "none", max_tokens: 120, stream: true, ...answer });
  let r = "", txt = "", pieces = 0;
  for await (const chunk of s) {
    const d = chunk.choices[0]?.delta ?? {};
    if (d.reasoning_content) pieces++;
    r += d.reasoning_content ?? "";
    txt += d.content ?? "";
  }
  assert.equal(r, "It is 21.");
  assert.equal(txt, SENTENCE);
  // Control: the same reply read without the family's channels is not split.
  const raw = await fast.chat.completions.create({ model: "m", messages: [{ role: "user", content: "x" }],
    max_tokens: 120, ...answer });
  assert.match(raw.choices[0].message.content, /^<\|channel\|>analysis/);
});

await check("harmony: a call the model writes (tool_choice auto) streams as delta.tool_calls after its reasoning", async () => {
  const reply = `<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Rome\"}`;
  const body = { model: "m", max_tokens: 200, messages: [{ role: "user", content: "Rome?" }],
    tools: [{ type: "function", function: weather }], grammar: `root ::= "${reply.replace(/"/g, '\\"')}"` };
  const s = await harmony.chat.completions.create({ ...body, stream: true });
  let r = "", deltas = [], finish = null;
  for await (const chunk of s) {
    const d = chunk.choices[0]?.delta ?? {};
    r += d.reasoning_content ?? "";
    if (d.tool_calls) deltas.push(...d.tool_calls);
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(r, "Need the weather.");
  assert.equal(deltas.length, 1);
  assert.equal(deltas[0].function.name, "get_weather");
  assert.deepEqual(JSON.parse(deltas[0].function.arguments), { city: "Rome" });
  assert.equal(finish, "tool_calls");
  // Control: with tool_choice none the same text is not a call.
  const none = await harmony.chat.completions.create({ ...body, tool_choice: "none" });
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.equal(none.choices[0].finish_reason, "stop");
  assert.match(none.choices[0].message.content, /to=functions\.get_weather/);
});

await check("harmony: reasoning_effort goes where the template puts it; other templates refuse it", async () => {
  const msgs = [{ role: "user", content: "hi" }];
  const low = await applyTemplate(harmonyUrl, { messages: msgs, reasoning_effort: "low" });
  assert.ok(low.prompt.includes("\n\nReasoning: low\n\n"), low.prompt);
  const dflt = await applyTemplate(harmonyUrl, { messages: msgs });
  assert.ok(dflt.prompt.includes("\n\nReasoning: medium\n\n"), "control: the default");
  const kw = await applyTemplate(harmonyUrl, { messages: msgs, chat_template_kwargs: { reasoning_effort: "high" } });
  assert.ok(kw.prompt.includes("\n\nReasoning: high\n\n"));
  const a = await harmony.chat.completions.create({ model: "m", messages: msgs, max_tokens: 1, reasoning_effort: "low" });
  const b = await harmony.chat.completions.create({ model: "m", messages: msgs, max_tokens: 1, reasoning_effort: "high" });
  assert.equal(b.usage.prompt_tokens, a.usage.prompt_tokens + 1, "'high' is one byte longer than 'low'");
  assert.equal(b.moestream.settings.request.chat_format.reasoning_effort, "high");
  await refusedWith(harmony.chat.completions.create({ model: "m", messages: msgs, max_tokens: 1,
    reasoning_effort: "low", chat_template_kwargs: { reasoning_effort: "high" } }), "reasoning_effort");
  await refusedWith(harmony.chat.completions.create({ model: "m", messages: msgs, max_tokens: 1,
    chat_template_kwargs: { enable_thinking: false } }), "chat_template_kwargs.enable_thinking");
  await refusedWith(tooled.chat.completions.create({ model: "m", messages: msgs, max_tokens: 1,
    reasoning_effort: "low" }), "reasoning_effort");
});

await check("responses: text as chat gives it, instructions, input items, streaming events", async () => {
  const base = { model: "m", max_output_tokens: 12, temperature: 0, store: false };
  const r = await fast.responses.create({ ...base, instructions: "Be brief.", input: "Say hello" });
  const chat = await fast.chat.completions.create({ model: "m", max_tokens: 12, temperature: 0,
    messages: [{ role: "system", content: "Be brief." }, { role: "user", content: "Say hello" }] });
  assert.equal(r.object, "response");
  assert.equal(r.output_text, chat.choices[0].message.content, "the same generation as chat");
  assert.equal(r.usage.output_tokens, chat.usage.completion_tokens);
  assert.equal(r.status, chat.choices[0].finish_reason === "length" ? "incomplete" : "completed");
  const other = await fast.responses.create({ ...base, input: "Say hello" });
  assert.notEqual(other.usage.input_tokens, r.usage.input_tokens, "control: instructions reach the prompt");
  // Input items (text parts) mean the same as the string.
  const items = await fast.responses.create({ ...base, instructions: "Be brief.",
    input: [{ type: "message", role: "user", content: [{ type: "input_text", text: "Say hello" }] }] });
  assert.equal(items.output_text, r.output_text);
  // Streamed: the event sequence, its deltas adding up to the same text.
  const stream = await fast.responses.create({ ...base, instructions: "Be brief.", input: "Say hello", stream: true });
  const types = [];
  let text = "", final = null;
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === "response.output_text.delta") text += ev.delta;
    if (ev.type === "response.completed" || ev.type === "response.incomplete") final = ev.response;
  }
  assert.equal(types[0], "response.created");
  assert.ok(types.includes("response.output_item.added") && types.includes("response.output_text.done"), types.join());
  assert.equal(text, r.output_text);
  assert.equal(final.output[0].content[0].text, r.output_text);
  assert.equal(types.filter((t) => t === "response.output_text.delta").length > 1, true, "streamed in pieces");
  await refusedWith(fast.responses.create({ ...base, input: "x", previous_response_id: "resp_1" }), "previous_response_id");
  await refusedWith(fast.responses.create({ ...base, input: "x", tools: [{ type: "web_search" }] }), "tools[0]");
  await refusedWith(fast.responses.create({ ...base, input: "x", max_output_tokens: -1 }), "max_output_tokens");
});

await check("responses: a forced function call, then its output sent back as input items", async () => {
  const tools = [{ type: "function", ...weather }];
  const req = { model: "m", max_output_tokens: 200, tools, ...noThink };
  const input = [{ role: "user", content: "Weather in Paris?" }];
  const r = await tooled.responses.create({ ...req, input, tool_choice: { type: "function", name: "get_weather" } });
  const calls = r.output.filter((o) => o.type === "function_call");
  assert.equal(calls.length, 1, JSON.stringify(r.output));
  assert.equal(calls[0].name, "get_weather");
  assert.ok(["Paris", "Rome"].includes(JSON.parse(calls[0].arguments).city));
  const back = [...input, calls[0], { type: "function_call_output", call_id: calls[0].call_id, output: '{"temp_c":21}' }];
  const next = await tooled.responses.create({ ...req, input: back, tool_choice: "none", max_output_tokens: 4 });
  assert.equal(next.output.filter((o) => o.type === "function_call").length, 0);
  // The call and its output reach the prompt in the template's syntax.
  const t = await applyTemplate(toolsUrl, { messages: [input[0],
    { role: "assistant", content: null, tool_calls: [{ id: calls[0].call_id, type: "function",
      function: { name: "get_weather", arguments: calls[0].arguments } }] },
    { role: "tool", tool_call_id: calls[0].call_id, content: '{"temp_c":21}' }], tools: [{ type: "function", function: weather }] });
  assert.equal(next.usage.input_tokens > r.usage.input_tokens, true, "control: the turn grew");
  assert.ok(t.prompt.includes('{"temp_c":21}'));
  // Streamed: the call arrives as a function_call item with its arguments.
  const stream = await tooled.responses.create({ ...req, input, stream: true,
    tool_choice: { type: "function", name: "get_weather" } });
  let args = null;
  for await (const ev of stream) if (ev.type === "response.function_call_arguments.done") args = ev.arguments;
  assert.deepEqual(JSON.parse(args), JSON.parse(calls[0].arguments));
});

await check("response_format json_object gives a JSON object", async () => {
  let complete = 0;
  for (const seed of [1, 2, 3, 5]) {
    const r = await fast.chat.completions.create({ model: "m", messages: [{ role: "user", content: "JSON" }],
      max_tokens: 120, temperature: 1, seed, response_format: { type: "json_object" } });
    if (r.choices[0].finish_reason !== "stop") continue;
    complete++;
    const v = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof v, "object");
    assert.ok(v !== null && !Array.isArray(v));
  }
  assert.ok(complete > 0, "some replies end by themselves");
  const plain = await fast.chat.completions.create({ model: "m", messages: [{ role: "user", content: "JSON" }],
    max_tokens: 40, temperature: 1, seed: 1 });
  assert.throws(() => JSON.parse(plain.choices[0].message.content), "control: no JSON without it");
});

async function stats(url) {
  return (await fetch(url + "stats")).json();
}

// Waits for a state of /stats, polling; `what` names it in the failure. The bound only catches
// a hang: the checks wait for the state, not for a time.
async function statsUntil(url, pred, what, boundMs = 60000) {
  const t0 = Date.now();
  for (;;) {
    const s = await stats(url);
    if (pred(s)) return s;
    assert.ok(Date.now() - t0 < boundMs, `no ${what} within ${boundMs / 1000} s: ${JSON.stringify(s)}`);
    await new Promise((r) => setTimeout(r, 20));
  }
}

await check("12 non-streaming clients that disconnect leave the queue empty", async () => {
  const before = (await stats(slowUrl)).requests;
  const aborts = [];
  const pending = [];
  for (let i = 0; i < 12; i++) {
    const ac = new AbortController();
    aborts.push(ac);
    pending.push(slow.completions.create({ model: "m", prompt: "Once upon a time", max_tokens: 400, ignore_eos: true },
      { signal: ac.signal }).catch(() => null));
  }
  // control: eleven wait behind the running one
  await statsUntil(slowUrl, (s) => s.generating && s.queue_waiting === 11, "running request with eleven queued");
  for (const ac of aborts) ac.abort();
  await Promise.all(pending);
  const s = await statsUntil(slowUrl, (s) => s.queue_waiting === 0 && !s.generating,
    "empty queue after the disconnects");
  assert.equal(s.requests.cancelled - before.cancelled, 12);
  assert.equal(s.requests.served - before.served, 0, "served and cancelled are disjoint");
  const after = await slow.completions.create({ model: "m", prompt: "Hi", max_tokens: 2 });
  assert.equal(after.usage.completion_tokens, 2, "the server still answers");
});

// GET on a new connection (fetch would reuse a kept-alive one, which a busy pool still serves).
function freshGet(url, timeoutMs) {
  return new Promise((resolve) => {
    const req = http.get(url, { agent: false, headers: { Connection: "close" } }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode));
    });
    req.setTimeout(timeoutMs, () => {
      req.destroy();
      resolve("timeout");
    });
    req.on("error", (e) => resolve(String(e)));
  });
}

await check("40 slow-header connections do not starve /health", async () => {
  // The 40 connections are accepted before each GET's (one listener, FIFO backlog and task
  // queue), and they keep sending header lines for the whole check, so the server can neither
  // finish nor time them out: if they exhausted its pool the GET would never be answered.
  const { port } = new URL(slowUrl);
  const socks = [];
  let closed = 0;
  for (let i = 0; i < 40; i++) {
    const sock = net.connect(Number(port), "127.0.0.1");
    sock.on("error", () => {});
    sock.on("close", () => closed++);
    sock.write("GET /health HTTP/1.1\r\nHost: x\r\n");
    socks.push(sock);
  }
  await Promise.all(socks.map((sock) => new Promise((r) => sock.once("connect", r))));
  let line = 0;
  const trickle = setInterval(() => {  // well inside the server's 5 s read timeout
    line++;
    for (const sock of socks) sock.write(`X-Slow-${line}: 1\r\n`);  // one header line at a time
  }, 200);
  try {
    for (let i = 0; i < 10; i++) {
      assert.equal(await freshGet(slowUrl + "health", 60000), 200, `GET ${i} answered`);
      assert.equal(closed, 0, "control: the slow connections were still open (holding their threads)");
    }
  } finally {
    clearInterval(trickle);
    for (const sock of socks) sock.destroy();
  }
});

// Real vendor templates (../shared/templates; run.sh skips them with the reason when absent):
// each family's forced call through runTools, streamed as delta.tool_calls, and its result
// rendered back by the template. MiniMax-M2 always thinks (a forced call closes a thinking
// block first, which a synth model never does): its call is a fixed reply (tool_choice auto).
const realUrls = Object.fromEntries((process.argv[7] ?? "").split(",").filter(Boolean)
  .map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)]));
// The key names the server (run.sh), the value the reply family its template loads as.
const realNames = { glm: "glm", deepseek: "deepseek", dsml: "deepseek-dsml", kimi: "kimi", seed: "seed",
  mistral: "mistral", granite: "hermes", functionary: "llama3.x", xml: "xml-function", lfm2: "lfm2",
  commandr: "command-r" };
for (const [fam, name] of Object.entries(realNames)) {
  if (!realUrls[fam]) continue;
  const client = new OpenAI({ baseURL: realUrls[fam] + "v1", apiKey: "none", maxRetries: 0 });
  await check(`${name} (${fam}, real template): runTools round trip, streamed call, result rendered back`, async () => {
    const { c, msgs } = await forcedWeatherRound(client, new RegExp(`^${name.replace(".", "\\.")} \\(`),
      { parallel_tool_calls: false, ...noThink }, [{ role: "user", content: "Weather in Paris?" }]);
    assert.deepEqual(msgs.map((m) => m.role), ["user", "assistant", "tool"]);
    assert.equal(msgs[2].tool_call_id, c.message.tool_calls[0].id);
    const tools = [{ type: "function", function: weather }];
    const t = await applyTemplate(realUrls[fam], { messages: msgs, tools });
    const user = t.prompt.lastIndexOf("Weather in Paris?");
    // (LFM2's template prints no assistant call, only its result.)
    if (fam !== "lfm2") assert.ok(t.prompt.indexOf("get_weather", user) > user, "the call follows the user turn");
    assert.ok(t.prompt.indexOf("temp_c", user) > user, "the result follows it");
    const s = client.chat.completions.stream({ model: "m", max_tokens: 200, parallel_tool_calls: false,
      tool_choice: forceWeather, messages: [{ role: "user", content: "Rome?" }], ...noThink, tools });
    let deltas = 0;
    for await (const chunk of s) deltas += chunk.choices[0]?.delta?.tool_calls?.length ?? 0;
    const done = await s.finalChatCompletion();
    assert.equal(deltas, 1);
    assert.equal(done.choices[0].finish_reason, "tool_calls");
    assert.equal(done.choices[0].message.tool_calls[0].function.name, "get_weather");
    // Control: tool_choice none leaves a grammar-fixed call of another family as content.
    const none = await client.chat.completions.create({ model: "m", max_tokens: 200, tools, tool_choice: "none",
      messages: [{ role: "user", content: "Rome?" }], ...noThink, grammar: `root ::= ${JSON.stringify("<x>get_weather</x>")}` });
    assert.equal(none.choices[0].message.tool_calls, undefined);
  });
}

if (realUrls.minimax) await check("minimax (real template): a call after its thinking streams as delta.tool_calls; result rendered back", async () => {
  const mm = new OpenAI({ baseURL: realUrls.minimax + "v1", apiKey: "none", maxRetries: 0 });
  const reply = "Need the weather.</think>\n\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n" +
    "<parameter name=\"city\">Rome</parameter>\n</invoke>\n</minimax:tool_call>";
  const tools = [{ type: "function", function: weather }];
  const body = { model: "m", max_tokens: 300, messages: [{ role: "user", content: "Rome?" }], tools,
    grammar: `root ::= ${JSON.stringify(reply)}` };
  const s = await mm.chat.completions.create({ ...body, stream: true });
  let r = "", calls = [], finish = null;
  for await (const chunk of s) {
    const d = chunk.choices[0]?.delta ?? {};
    r += d.reasoning_content ?? "";
    if (d.tool_calls) calls.push(...d.tool_calls);
    finish = chunk.choices[0]?.finish_reason ?? finish;
  }
  assert.equal(r, "Need the weather.");
  assert.equal(calls.length, 1);
  assert.equal(calls[0].function.name, "get_weather");
  assert.deepEqual(JSON.parse(calls[0].function.arguments), { city: "Rome" });
  assert.equal(finish, "tool_calls");
  const msgs = [{ role: "user", content: "Rome?" },
    { role: "assistant", content: null, tool_calls: [{ id: calls[0].id, type: "function", function: calls[0].function }] },
    { role: "tool", tool_call_id: calls[0].id, content: '{"temp_c":21}' }];
  const t = await applyTemplate(realUrls.minimax, { messages: msgs, tools });
  assert.ok(t.prompt.includes('<invoke name="get_weather">\n<parameter name="city">Rome</parameter>'), t.prompt.slice(-400));
  assert.ok(t.prompt.includes('{"temp_c":21}'));
  const none = await mm.chat.completions.create({ ...body, tool_choice: "none" });  // control
  assert.equal(none.choices[0].message.tool_calls, undefined);
  assert.match(none.choices[0].message.content, /<minimax:tool_call>/);
});

await check("SIGTERM ends a stream with a final chunk and [DONE]", async () => {
  const stream = await slow.completions.create({ model: "m", prompt: "Once", max_tokens: 400, ignore_eos: true, stream: true });
  let chunks = 0, finish = null, killed = false;
  for await (const c of stream) {  // the SDK throws if the stream ends without [DONE]
    chunks++;
    finish = c.choices[0]?.finish_reason ?? finish;
    if (chunks === 5 && !killed) {
      killed = true;
      process.kill(Number(slowPid), "SIGTERM");
    }
  }
  assert.ok(killed, "control: the signal was sent mid-stream");
  assert.equal(finish, "cancelled");
});

console.log(failed ? `${failed} check(s) failed` : "all checks passed");
process.exit(failed ? 1 : 0);
