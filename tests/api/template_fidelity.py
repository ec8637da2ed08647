#!/usr/bin/env python3
"""template_fidelity.py — moestream's chat-format renderers against llama.cpp's Jinja.

For each template family moestream renders itself (tools/chat/chat_format_*.cpp), a tiny
synth model carries a template of that family written for this test (tests/api/templates/);
the same conversations (system, user, multi-turn, tools, tool calls, tool results, thinking on
and off) go to `moestream serve` and to Debian's `llama-server` (Jinja) on the same GGUF, both
real processes on loopback, through POST /apply-template; the prompts must be byte-identical.
Negative control: a template of the family that differs from the renderer by one newline
(still recognised as the family) must give different prompts, so the comparison can fail.
Harmony replies (HARMONY_REPLIES) are also generated on both servers, fixed by a grammar, and
their split into content and reasoning_content compared with llama-server's harmony parser.

Usage: template_fidelity.py MOESTREAM_BIN SRC_DIR MODELS_DIR. Exit 0 when all match.
"""
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Current weather for a city (°C, \"quoted\")",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "enum": ["Paris", "Rome"]},
            "days": {"type": "integer", "minimum": 1, "default": 1.5}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "add", "description": "a + b",
        "parameters": {"type": "object", "properties": {
            "b": {"type": "number"}, "a": {"type": "number"}}, "required": ["a", "b"]}}},
]


def call(cid, name, args):
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": args}}


def conversations():
    u = {"role": "user", "content": "Weather in Paris? Ünïcode ✓"}
    s = {"role": "system", "content": "You are terse."}
    tc = {"role": "assistant", "content": None,
          "tool_calls": [call("call00001", "get_weather", "{\"city\":\"Paris\",\"days\": 2}")]}
    tr = {"role": "tool", "tool_call_id": "call00001", "content": "{\"temp\": 21}"}
    return {
        "user": {"messages": [u]},
        "system-user": {"messages": [s, u]},
        "multi-turn": {"messages": [s, u, {"role": "assistant", "content": "Sunny."},
                                    {"role": "user", "content": "And tomorrow?"}]},
        "late-system": {"messages": [u, {"role": "assistant", "content": "Sunny."},
                                     {"role": "system", "content": "Be brief."},
                                     {"role": "user", "content": "Rome?"}]},
        "tools-offered": {"messages": [s, u], "tools": TOOLS},
        "tools-no-system": {"messages": [u], "tools": TOOLS},
        "tool-round-trip": {"messages": [s, u, tc, tr], "tools": TOOLS},
        "tool-round-trip-then-user": {
            "messages": [s, u, tc, tr, {"role": "assistant", "content": "21 °C."},
                         {"role": "user", "content": "Thanks"}], "tools": TOOLS},
        "parallel-calls": {"messages": [u, {"role": "assistant", "content": "Checking.",
                                            "tool_calls": [call("call0000a", "get_weather",
                                                                "{\"city\": \"Rome\"}"),
                                                           call("call0000b", "add",
                                                                "{\"b\": 2, \"a\": 1.25}")]},
                                        {"role": "tool", "tool_call_id": "call0000a", "content": "sun"},
                                        {"role": "tool", "tool_call_id": "call0000b", "content": "3.25"}],
                           "tools": TOOLS},
        "reasoning-in-loop": {"messages": [u, dict(tc, reasoning_content="Need the tool."), tr],
                              "tools": TOOLS},
        "reasoning-before-user": {"messages": [u, {"role": "assistant", "content": "Sunny.",
                                                   "reasoning_content": "old thought"},
                                               {"role": "user", "content": "ok"}]},
        "thinking-off": {"messages": [u], "chat_template_kwargs": {"enable_thinking": False}},
        "thinking-on": {"messages": [u], "chat_template_kwargs": {"enable_thinking": True}},
        "tools-thinking-off": {"messages": [s, u, tc, tr], "tools": TOOLS,
                               "chat_template_kwargs": {"enable_thinking": False}},
        # Reasoning effort: only a template with effort levels takes it (the others: 400).
        "effort-kwargs": {"messages": [u], "chat_template_kwargs": {"reasoning_effort": "high"}},
        "effort-field": {"messages": [s, u], "tools": TOOLS, "reasoning_effort": "low"},
        # Harmony only: the TypeScript-like declaration of more property types.
        "tools-typed": {"messages": [u], "tools": TOOLS + TYPED_TOOLS},
    }


# Tools whose declaration only the harmony family turns into types (other families print
# the JSON, which the conversations above already compare).
TYPED_TOOLS = [
    {"type": "function", "function": {
        "name": "search", "parameters": {"type": "object", "properties": {
            "q": {"type": "string", "description": "the query"},
            "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
            "ids": {"type": "array", "items": {"type": "integer"}},
            "exact": {"type": "boolean", "default": False},
            "mode": {"enum": ["x", 2, None]},
            "extra": {"type": "object"}, "anything": {}},
            "required": ["q", "exact"]}}},
    {"type": "function", "function": {"name": "now", "description": "the time"}},
]
HARMONY_ONLY = {"tools-typed"}

# Harmony replies (fixed by a grammar, without tools: llama-server refuses a grammar with
# tools) split into content and reasoning_content by moestream and by llama-server's own
# harmony parser; compared without blank text at the ends (moestream drops it, llama-server
# keeps it). Not compared: a reply without a header (llama-server answers 500) and a message
# ended by the next <|start|> alone (llama-server keeps it in the message; moestream, whose
# decoder does not print <|end|>, ends the message there).
HARMONY_REPLIES = [
    "<|channel|>analysis<|message|>Think <b>.<|end|><|start|>assistant<|channel|>final"
    "<|message|>Hello, there",
    "<|channel|>analysis<|message|> A b. <|end|><|start|>assistant<|channel|>final<|message|> C d ",
    "<|channel|>commentary<|message|>Pre.<|end|><|start|>assistant<|channel|>final<|message|>Done",
    "<|channel|>final<|message|>Hi there",
    "<|channel|>analysis<|message|>cut here",
]
# Negative control: a reply the two split differently (see above) must compare unequal.
HARMONY_REPLY_DIFFERS = "<|channel|>analysis<|message|>A<|start|>assistant<|channel|>final<|message|>B"
EFFORT = {"effort-kwargs", "effort-field"}


# family: (template file, the moestream format name starts with, conversations it cannot
# express), and the one-newline change of the negative control.
FAMILIES = {
    "hermes-qwen3": ("hermes-qwen3.jinja", "hermes-qwen3", EFFORT,
                     ("'\\n<tool_response>\\n'", "'\\n<tool_response>'")),
    # One call per assistant turn, and no thinking to enable: those are refused (400);
    # enable_thinking false is accepted (there is no thinking).
    "llama3": ("llama3.jinja", "llama3.x", {"parallel-calls", "thinking-on"} | EFFORT,
               ('"Environment: ipython\\n"', '"Environment: ipython"')),
    # A system message after the first breaks the alternation; no thinking to enable.
    "mistral": ("mistral.jinja", "mistral", {"late-system", "thinking-on"} | EFFORT,
                ("system_message + '\\n\\n'", "system_message + '\\n'")),
    # Thinking cannot be turned off (reasoning_effort low shortens it).
    "harmony": ("harmony.jinja", "harmony", {"thinking-off", "tools-thinking-off"},
                ('"\\nCalls to these tools', '"Calls to these tools')),
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, path="apply-template"):
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def wait_up(proc, url_of, what):
    for _ in range(300):
        if proc.poll() is not None:
            raise SystemExit("%s exited (%d)" % (what, proc.returncode))
        url = url_of()
        if url:
            try:
                with urllib.request.urlopen(url + "health", timeout=2) as r:
                    if r.status == 200:
                        return url
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
        time.sleep(0.1)
    raise SystemExit("%s did not start" % what)


class Servers:
    """moestream serve and llama-server on one model; stopped on exit."""

    def __init__(self, ms_bin, src, model, work):
        self.procs = []
        out = os.path.join(work, os.path.basename(model) + ".ms.out")
        self.ms = subprocess.Popen([ms_bin, "serve", "-m", model, "--port", "0", "--lossless",
                                    "-c", "1024", "-t", "1"], stdout=open(out, "w"),
                                   stderr=subprocess.DEVNULL)
        self.procs.append(self.ms)
        port = free_port()
        self.ls = subprocess.Popen([os.path.join(src, "scripts", "llama-tool"), "llama-server",
                                    "-m", model, "--host", "127.0.0.1", "--port", str(port),
                                    "-c", "1024", "-t", "1", "--no-webui"],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   env=dict(os.environ, MOESTREAM_BIN=ms_bin))
        self.procs.append(self.ls)

        def ms_url():
            m = re.search(r"http://127\.0\.0\.1:\d+/", open(out).read())
            return m.group(0) if m else None
        self.ms_url = wait_up(self.ms, ms_url, "moestream serve")
        self.ms_banner = open(out).read()
        self.ls_url = wait_up(self.ls, lambda: "http://127.0.0.1:%d/" % port, "llama-server")

    def close(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def make_model(ms_bin, src, models, name, template_text):
    base = os.path.join(models, "tiny-qwen3moe-q4_k-api.gguf")
    if not os.path.exists(base):
        subprocess.run([ms_bin, "synth", "--preset", "tiny", "--type", "q4_k", "-o", base],
                       check=True, stdout=subprocess.DEVNULL)
    tf = os.path.join(models, name + ".jinja")
    with open(tf, "w") as f:
        f.write(template_text)
    out = os.path.join(models, "tmpl-" + name + ".gguf")
    subprocess.run([sys.executable, os.path.join(src, "tests", "tools", "gguf_mutate.py"),
                    base, out, "set-file", "tokenizer.chat_template=" + tf], check=True)
    return out


def main():
    ms_bin, src, models = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(models, exist_ok=True)
    work = tempfile.mkdtemp(prefix="moestream-fidelity-")
    failures, compared = [], 0
    for fam, (tfile, prefix, skip, (good, wrong)) in FAMILIES.items():
        text = open(os.path.join(src, "tests", "api", "templates", tfile)).read()
        assert text.count(good) == 1, "%s: the negative control's anchor is not unique" % fam
        for variant, tmpl in (("same", text), ("wrong", text.replace(good, wrong))):
            model = make_model(ms_bin, src, models, fam + "-" + variant, tmpl)
            srv = Servers(ms_bin, src, model, work)
            try:
                if "chat template " + prefix not in srv.ms_banner:
                    failures.append("%s/%s: moestream did not take it for the family: %s" %
                                    (fam, variant, srv.ms_banner.strip()))
                    continue
                differ = 0
                for cname, body in conversations().items():
                    if cname in HARMONY_ONLY and fam != "harmony":
                        continue
                    if cname in skip:  # the family cannot express it: refused, not bent
                        sa, a = post(srv.ms_url, body)
                        if sa != 400:
                            failures.append("%s/%s/%s: expected a 400, got %d: %s" %
                                            (fam, variant, cname, sa, a))
                        continue
                    sa, a = post(srv.ms_url, body)
                    sb, b = post(srv.ls_url, body)
                    if sa != 200 or sb != 200:
                        failures.append("%s/%s/%s: HTTP %d / %d: %s | %s" %
                                        (fam, variant, cname, sa, sb, a, b))
                        continue
                    if not a.get("chat_template", "").startswith(prefix):
                        failures.append("%s/%s/%s: chat_template %r" %
                                        (fam, variant, cname, a.get("chat_template")))
                    compared += 1
                    if a["prompt"] != b["prompt"]:
                        differ += 1
                        if variant == "same":
                            failures.append("%s/%s: moestream and llama-server differ:\n"
                                            "  moestream:    %r\n  llama-server: %r" %
                                            (fam, cname, a["prompt"], b["prompt"]))
                if fam == "harmony" and variant == "same":
                    for reply in HARMONY_REPLIES + [HARMONY_REPLY_DIFFERS]:
                        g = 'root ::= "%s"' % reply.replace("\\", "\\\\").replace('"', '\\"')
                        body = {"messages": [{"role": "user", "content": "hi"}],
                                "max_tokens": 200, "grammar": g}
                        got = []
                        for url in (srv.ms_url, srv.ls_url):
                            st, j = post(url, body, "v1/chat/completions")
                            m = j["choices"][0]["message"] if st == 200 else {"status": st}
                            got.append(((m.get("content") or "").strip(),
                                        (m.get("reasoning_content") or "").strip()))
                        if reply == HARMONY_REPLY_DIFFERS:
                            if got[0] == got[1]:
                                failures.append("harmony replies: negative control: %r split "
                                                "alike (%r)" % (reply, got[0]))
                            continue
                        compared += 1
                        if got[0] != got[1]:
                            failures.append("harmony reply %r: moestream %r, llama-server %r" %
                                            (reply, got[0], got[1]))
                    print("harmony/replies: %d parsed replies compared" % len(HARMONY_REPLIES))
                if variant == "wrong" and differ == 0:
                    failures.append("%s: negative control: a template one newline away "
                                    "rendered the same as moestream's renderer" % fam)
                print("%s/%s: %d conversations compared, %d differ" %
                      (fam, variant, len([c for c in conversations() if c not in skip and
                                          (fam == "harmony" or c not in HARMONY_ONLY)]), differ))
            finally:
                srv.close()
    for f in failures:
        print("FAIL " + f)
    print("%d prompts and replies compared, %d failures" % (compared, len(failures)))
    return 1 if failures or compared == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
