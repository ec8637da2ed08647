#!/usr/bin/env python3
"""template_fidelity.py — moestream's chat-template rendering against llama-server's.

Every template of ../shared/templates (real vendor templates; skipped with a reason when the
folder is absent) and of tests/api/templates is embedded in a tiny synth model; six message
sets (system + user, no system, multi-turn, tools, an assistant tool call + its result,
reasoning in the history) go to `moestream serve` and to Debian's `llama-server` (--jinja is its
default) on the same GGUF, both real processes on loopback, through POST /apply-template. The
prompts must be byte-identical, and moestream must not refuse what llama-server renders.

Where minja cannot parse a template, raises on a message set, or renders its start-up probes
differently from Python's own Jinja, moestream renders with Debian's python3-jinja2 (set up as
Hugging Face transformers renders chat templates): PYTHON_ONLY and PYTHON_RENDERED below (each
listed in docs/server.md with the construct) must then match llama-server too.

Negative control: moestream serve given the Qwen3 template one character off
(--chat-template-file) must render differently from llama-server on the real template.
Harmony replies (HARMONY_REPLIES) are also generated on both servers for the project's harmony
template, fixed by a grammar, and their split into content and reasoning_content compared.

Usage: template_fidelity.py MOESTREAM_BIN SRC_DIR MODELS_DIR. Exit 0 when all match.
"""
import glob
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

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather for a city (°C, \"quoted\")",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]}}}]


def conversations():
    u = {"role": "user", "content": "Weather in Paris? Ünïcode ✓"}
    s = {"role": "system", "content": "You are terse."}
    tc = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call00001", "type": "function",
         "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]}
    tr = {"role": "tool", "tool_call_id": "call00001", "content": "{\"temp\": 21}"}
    return {
        "system-user": {"messages": [s, u]},
        "no-system": {"messages": [u]},
        "multi-turn": {"messages": [s, u, {"role": "assistant", "content": "Sunny."},
                                    {"role": "user", "content": "And tomorrow?"}]},
        "tools": {"messages": [s, u], "tools": TOOLS},
        "tool-result": {"messages": [s, u, tc, tr], "tools": TOOLS},
        "reasoning": {"messages": [u, {"role": "assistant", "content": "Sunny.",
                                       "reasoning_content": "old thought"},
                                   {"role": "user", "content": "ok"}]},
    }


# (template, message set) -> what minja cannot do, where the template raises in minja and
# moestream hands it to python3-jinja2, which renders llama-server's text. docs/server.md.
PYTHON_RENDERED = {
    ("MiniMax-M2", "tools"): "tojson(ensure_ascii=...)",
    ("MiniMax-M2", "tool-result"): "tojson(ensure_ascii=...)",
    ("GigaChat3-10B-A1.8B", "tool-result"): "tojson(ensure_ascii=...)",
}
# Templates minja cannot parse: python3-jinja2 renders them (the server's name says so).
# Seed-OSS: minja drops the spaces before a {{ }} that starts a line (its tool description)
# where python3-jinja2 and llama-server keep them; moestream's start-up cross-check sees it.
PYTHON_ONLY = {"GLM-4.6": "Expected comma in tuple",
               "ByteDance-Seed-OSS": "spaces before a {{ }} that starts a line"}
# Hy3 parses in minja but raises on every render (Python's str.format): each request is
# python3-jinja2's ("Unknown method: format").


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(url, body, path="apply-template"):
    req = urllib.request.Request(url + path, json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        try:
            return e.code, json.load(e)
        except ValueError:
            return e.code, {}


def wait_up(proc, url_of, what):
    for _ in range(600):
        if proc.poll() is not None:
            return None
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


class Moestream:
    """moestream serve on a model (optionally with --chat-template-file)."""

    def __init__(self, ms_bin, model, work, extra=()):
        self.out = os.path.join(work, os.path.basename(model) + ".ms.out")
        self.err = os.path.join(work, os.path.basename(model) + ".ms.err")
        self.proc = subprocess.Popen([ms_bin, "serve", "-m", model, "--port", "0", "--lossless",
                                      "-c", "1024", "-t", "1"] + list(extra),
                                     stdout=open(self.out, "w"), stderr=open(self.err, "w"))

        def url():
            m = re.search(r"http://127\.0\.0\.1:\d+/", open(self.out).read())
            return m.group(0) if m else None
        self.url = wait_up(self.proc, url, "moestream serve")
        self.banner = open(self.out).read()

    def stderr(self):
        return open(self.err).read()

    def close(self):
        stop(self.proc)


class LlamaServer:
    def __init__(self, src, ms_bin, model):
        port = free_port()
        self.proc = subprocess.Popen([os.path.join(src, "scripts", "llama-tool"), "llama-server",
                                      "-m", model, "--host", "127.0.0.1", "--port", str(port),
                                      "-c", "1024", "-t", "1", "--no-webui"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     env=dict(os.environ, MOESTREAM_BIN=ms_bin))
        self.url = wait_up(self.proc, lambda: "http://127.0.0.1:%d/" % port, "llama-server")
        if self.url is None:
            raise SystemExit("llama-server exited (%d) on %s" % (self.proc.returncode, model))

    def close(self):
        stop(self.proc)


def stop(p):
    if p.poll() is None:
        p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()


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


def harmony_replies(ms, ls, failures):
    compared = 0
    for reply in HARMONY_REPLIES + [HARMONY_REPLY_DIFFERS]:
        g = 'root ::= "%s"' % reply.replace("\\", "\\\\").replace('"', '\\"')
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 200, "grammar": g}
        got = []
        for url in (ms.url, ls.url):
            st, j = post(url, body, "v1/chat/completions")
            m = j["choices"][0]["message"] if st == 200 else {"status": st}
            got.append(((m.get("content") or "").strip(), (m.get("reasoning_content") or "").strip()))
        if reply == HARMONY_REPLY_DIFFERS:
            if got[0] == got[1]:
                failures.append("harmony replies: negative control: %r split alike (%r)" %
                                (reply, got[0]))
            continue
        compared += 1
        if got[0] != got[1]:
            failures.append("harmony reply %r: moestream %r, llama-server %r" % (reply, got[0], got[1]))
    print("harmony/replies: %d parsed replies compared" % compared)
    return compared


def make_model(ms_bin, src, models, name, template_path):
    base = os.path.join(models, "tiny-qwen3moe-q4_k-api.gguf")
    if not os.path.exists(base):
        subprocess.run([ms_bin, "synth", "--preset", "tiny", "--type", "q4_k", "-o", base],
                       check=True, stdout=subprocess.DEVNULL)
    out = os.path.join(models, "tmpl-" + name + ".gguf")
    if not os.path.exists(out) or os.path.getmtime(out) < os.path.getmtime(template_path):
        subprocess.run([sys.executable, os.path.join(src, "tests", "tools", "gguf_mutate.py"),
                        base, out + ".tmp", "set-file", "tokenizer.chat_template=" + template_path],
                       check=True)
        os.replace(out + ".tmp", out)
    return out


def check_template(ms_bin, src, models, work, name, path, failures):
    model = make_model(ms_bin, src, models, name, path)
    text = open(path).read()
    ls = LlamaServer(src, ms_bin, model)
    ms = Moestream(ms_bin, model, work)
    compared = 0
    try:
        if (name in PYTHON_ONLY) != ("python3-jinja2" in ms.banner):
            failures.append("%s: python3-jinja2 %s expected to render it: %s" %
                            (name, "was" if name in PYTHON_ONLY else "was not",
                             ms.banner.strip()))
        if ms.url is None:
            failures.append("%s: moestream serve did not start: %s" % (name, ms.stderr().strip()[-300:]))
            return 0
        line = []
        for cname, body in conversations().items():
            sa, a = post(ms.url, body)
            sb, b = post(ls.url, body)
            key = (name, cname)
            if sb != 200:  # llama-server refuses: moestream may too
                line.append("%s: llama-server %d" % (cname, sb))
                continue
            if sa != 200:
                failures.append("%s/%s: moestream refused (%d: %s) what llama-server renders" %
                                (name, cname, sa, a))
                continue
            if not a.get("chat_template"):
                failures.append("%s/%s: no chat_template name" % (name, cname))
            compared += 1
            if a["prompt"] == b["prompt"]:
                line.append(cname + (": same (python3-jinja2: %s)" % PYTHON_RENDERED[key]
                                     if key in PYTHON_RENDERED else ": same"))
                continue
            failures.append("%s/%s: moestream and llama-server differ:\n  moestream:    %r\n"
                            "  llama-server: %r" % (name, cname, a["prompt"], b["prompt"]))
        if name == "harmony":
            compared += harmony_replies(ms, ls, failures)
        if name == "Qwen-Qwen3-0.6B":  # negative control: one character off
            wrong = os.path.join(work, "qwen3-wrong.jinja")
            anchor = "<|im_start|>assistant\\n"
            assert anchor in text, anchor
            i = text.rindex(anchor)  # the generation prompt's opener, one letter changed
            open(wrong, "w").write(text[:i] + anchor.replace("assistant", "assistent") +
                                   text[i + len(anchor):])
            bad = Moestream(ms_bin, model, work, ["--chat-template-file", wrong])
            try:
                body = conversations()["tool-result"]
                sa, a = post(bad.url, body)
                sb, b = post(ls.url, body)
                if sa != 200 or a["prompt"] == b["prompt"]:
                    failures.append("negative control: a template one character off rendered "
                                    "the same as llama-server on the real one (%d)" % sa)
                if "--chat-template-file" not in a.get("chat_template", ""):
                    failures.append("negative control: the name does not say --chat-template-file: %r"
                                    % a.get("chat_template"))
                line.append("one character off: differs")
            finally:
                bad.close()
        print("%s [%s]: %s" % (name, ms.banner.split("chat template ")[-1].strip().rstrip(")"),
                               "; ".join(line)), flush=True)
    finally:
        ms.close()
        ls.close()
    return compared


def main():
    ms_bin, src, models = sys.argv[1], sys.argv[2], sys.argv[3]
    os.makedirs(models, exist_ok=True)
    work = tempfile.mkdtemp(prefix="moestream-fidelity-")
    failures, compared = [], 0
    shared = os.path.join(src, "..", "shared", "templates")
    templates = sorted(glob.glob(os.path.join(src, "tests", "api", "templates", "*.jinja")))
    if os.path.isdir(shared):
        templates += sorted(glob.glob(os.path.join(shared, "*.jinja")))
    else:
        print("SKIP the real vendor templates: %s is absent (a clone without ../shared)" % shared)
    t0 = time.time()
    for path in templates:
        name = os.path.basename(path)[:-len(".jinja")]
        compared += check_template(ms_bin, src, models, work, name, path, failures)
    for f in failures:
        print("FAIL " + f)
    print("%d templates, %d prompts and replies compared, %d failures (%.0f s)" %
          (len(templates), compared, len(failures), time.time() - t0))
    return 1 if failures or compared == 0 else 0


if __name__ == "__main__":
    sys.exit(main())
