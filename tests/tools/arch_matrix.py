#!/usr/bin/env python3
"""arch_matrix.py — streaming checked on every MoE architecture llama.cpp's test-llama-archs writes.

  arch_matrix.py run DIR [--jobs N] [--only REGEX] [--keep]
      1. `llama-tool test-llama-archs -s 1 -d 0.5 -o DIR/raw` writes llama.cpp's tiny test
         models (fixed seed, weights' standard deviation 0.5);
      2. moe_rewrite.py turns every MoE one into DIR/models/<arch>.gguf with 8 experts top-2,
         plus a gate-less (up/down experts) nemotron_h_moe made from its dense file, the
         qwen3moe one split into shards (llama-gguf-split) and a synth glm4moe with a NextN
         layer;
      3. per architecture: `moestream inspect` (does the index accept it, and why not), then
         - `run --no-stream` (llama.cpp's own loading, everything resident) is the reference;
         - streaming with the cache off, with a small forced cache (evicting), and with the
           small cache plus --prefetch must give the same token ids, the same logits hash
           over every step and the same final logits bytes;
         - Debian's llama-completion (same CPU backend, greedy) must print the same tokens
           (the test vocabulary prints each token id, so equal text is equal ids);
         - negative control: MOESTREAM_DEBUG_CORRUPT_EXPERT=<first MoE layer>:* (every routed
           slice of that layer corrupted after the read) must change the logits.
      Writes DIR/results.json and removes the models that passed (all with --keep); exit 1 when any architecture that streams fails a check or an
      architecture cannot be run at all, 0 otherwise (architectures the index refuses are
      results, listed with the reason).
  arch_matrix.py doc RESULTS DOC     write the architecture list (docs/architectures.md)
  arch_matrix.py check RESULTS DOC   exit 1 when DOC is not what `doc` writes from RESULTS

Env: MOESTREAM_BIN (default build/bin/moestream), LLAMA_TOOL (default scripts/llama-tool),
GGML_BACKEND_PATH (the CPU backend both load). Standard library only.
"""
import concurrent.futures
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
N_PREDICT = 16
PROMPT = "Hello"
# The streaming variants compared with --no-stream: cache off, a small forced cache that
# evicts (with the cache's poison and residency checks), and the small cache with prefetch.
# "SMALL" is one token's working set (inspect), rounded up to MiB: below the 1.5 x rule, so
# forced, and far below the expert bank, so it evicts.
VARIANTS = [
    ("cache-off", ["--cache-mb", "0"]),
    ("small-cache", ["--cache-mb", "SMALL", "--force-cache", "--cache-debug"]),
    ("prefetch", ["--cache-mb", "SMALL", "--force-cache", "--prefetch"]),
]
# Quantized copies of every architecture the index accepts (None) or of those matching.
QUANTS = [("Q4_K_M", None),
          ("MXFP4_MOE", r"^(qwen3moe|qwen35moe|gpt-oss|nemotron_h_moe-gateless)$")]
# A hand-made layout test-llama-archs does not write as MoE: the gate-less experts of
# nemotron_h_moe (relu^2 up/down), made from its dense file.
GATELESS = {"nemotron_h_moe": "nemotron_h_moe-dense.gguf"}


def tool_env():
    e = dict(os.environ)
    e.setdefault("MOESTREAM_BIN", os.path.join(REPO, "build", "bin", "moestream"))
    e.setdefault("LLAMA_TOOL", os.path.join(REPO, "scripts", "llama-tool"))
    return e


def sh(cmd, env, timeout=300):
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124, b"", ("timed out after %d s: %s" % (timeout, " ".join(cmd))).encode()
    return p.returncode, p.stdout, p.stderr


def last_line(b):
    lines = [x for x in b.decode("utf-8", "replace").splitlines() if x.strip()]
    return lines[-1] if lines else ""


def make_models(out, env, only):
    raw = os.path.join(out, "raw")
    models = os.path.join(out, "models")
    os.makedirs(raw, exist_ok=True)
    os.makedirs(models, exist_ok=True)
    # A fixed seed (the default is random) and a wider weight spread than the default 0.1,
    # under which most of these models repeat one token after a few steps.
    rc, o, e = sh([env["LLAMA_TOOL"], "test-llama-archs", "-s", "1", "-d", "0.5", "-o", raw], env,
                  timeout=600)
    if rc != 0:
        raise SystemExit("arch_matrix: test-llama-archs -o %s failed (%d): %s" % (raw, rc, last_line(e)))
    jobs = []
    for f in sorted(os.listdir(raw)):
        if f.endswith("-moe.gguf"):
            jobs.append((f[:-len("-moe.gguf")], os.path.join(raw, f), []))
    for name, f in GATELESS.items():
        if os.path.exists(os.path.join(raw, f)):
            jobs.append((name + "-gateless", os.path.join(raw, f), ["--gateless-from-dense"]))
        else:
            raise SystemExit("arch_matrix: test-llama-archs wrote no %s" % f)
    cases = []
    for name, src, extra in jobs:
        if only and not re.search(only, name):
            continue
        dst = os.path.join(models, name + ".gguf")
        rc, o, e = sh([sys.executable, os.path.join(HERE, "moe_rewrite.py"), src, dst] + extra, env)
        cases.append({"name": name, "model": dst, "rewrite_error": last_line(e) if rc else ""})
    shutil.rmtree(raw)  # ~1 GB; the rewritten models are what the checks use
    # Quantized copies (Debian's llama-quantize) of the files the index accepts.
    quantized = []
    for c in cases:
        if c["rewrite_error"]:
            continue
        if sh([env["MOESTREAM_BIN"], "inspect", "-m", c["model"]], env)[0] != 0:
            continue
        for qname, pattern in QUANTS:
            if pattern and not re.search(pattern, c["name"]):
                continue
            dst = c["model"][:-5] + "@" + qname + ".gguf"
            rc, o, e = sh([env["LLAMA_TOOL"], "llama-quantize", c["model"], dst, qname], env)
            quantized.append({"name": c["name"] + "@" + qname, "model": dst,
                              "rewrite_error": ("llama-quantize: " + last_line(e)) if rc else ""})
    return cases + quantized + hand_made(models, cases, env, only)


def hand_made(models, cases, env, only):
    """The layouts test-llama-archs does not write: a split set (the qwen3moe model in shards
    by llama-gguf-split; -m names the first shard) and a glm4moe file that keeps a NextN layer
    (moestream synth --nextn-layers 1)."""
    out = []
    src = next((c["model"] for c in cases if c["name"] == "qwen3moe" and not c["rewrite_error"]), None)
    if src and (not only or re.search(only, "qwen3moe-split")):
        prefix = os.path.join(models, "qwen3moe-split")
        rc, o, e = sh([env["LLAMA_TOOL"], "llama-gguf-split", "--split", "--split-max-tensors",
                       "12", src, prefix], env)
        shards = sorted(f for f in os.listdir(models) if f.startswith("qwen3moe-split-"))
        err = ("llama-gguf-split: " + last_line(e)) if rc else (
            "" if len(shards) >= 2 else "llama-gguf-split wrote %d shard(s), not a set" % len(shards))
        out.append({"name": "qwen3moe-split", "model": prefix + "-00001-of-%05d.gguf" % len(shards),
                    "rewrite_error": err})
    if not only or re.search(only, "glm4moe-nextn"):
        dst = os.path.join(models, "glm4moe-nextn.gguf")
        rc, o, e = sh([env["MOESTREAM_BIN"], "synth", "--preset", "tiny", "--arch", "glm4moe",
                       "--type", "f32", "--nextn-layers", "1", "-o", dst], env)
        out.append({"name": "glm4moe-nextn", "model": dst,
                    "rewrite_error": ("synth: " + last_line(e)) if rc else ""})
    return out


def moestream_run(env, model, flags, tag, extra_env=None):
    base = model[:-5] + "." + tag
    cmd = [env["MOESTREAM_BIN"], "run", "-m", model, "-p", PROMPT, "-n", str(N_PREDICT), "-t", "1",
           "--stats-json", base + ".json", "--dump-logits", base + ".logits"] + flags
    e = dict(env)
    e.update(extra_env or {})
    rc, o, err = sh(cmd, e)
    r = {"rc": rc, "err": last_line(err), "text": o.decode("utf-8", "replace")}
    if rc == 0:
        with open(base + ".json") as f:
            j = json.load(f)
        with open(base + ".logits", "rb") as f:
            r["logits"] = hashlib.sha256(f.read()).hexdigest()
        r["tokens"], r["logits_sha"], r["stats"] = j["tokens"], j["logits_sha"], j
    for s in (".json", ".logits"):
        if os.path.exists(base + s):
            os.remove(base + s)
    return r


def llama_completion(env, model):
    return sh([env["LLAMA_TOOL"], "llama-completion", "-m", model, "-p", PROMPT, "-n",
               str(N_PREDICT), "--temp", "0", "-s", "1", "-no-cnv", "--no-warmup", "-lm", "mmap",
               "--no-repack", "-t", "1", "-fit", "off", "--no-display-prompt"], env)


def reason_of(err, model):
    # The refusal without the file's path (the doc is the same on every machine).
    return err.replace("moestream: ", "", 1).replace(model + ": ", "").replace(model, "<file>")


def check_case(c, env):
    t0 = time.monotonic()
    res = {"name": c["name"], "arch": "", "streams": False, "reason": "", "failures": []}
    fail = res["failures"].append
    if c["rewrite_error"]:
        fail("moe_rewrite: " + c["rewrite_error"])
        return res
    model = c["model"]
    res["arch"] = c["name"].split("@")[0].split("-gateless")[0]
    rc, o, e = sh([env["MOESTREAM_BIN"], "inspect", "-m", model, "--json"], env)
    if rc != 0:
        # Refused by the index: `run` must refuse it the same way, streaming or not.
        res["reason"] = reason_of(last_line(e), model)
        for tag, flags in (("refused", ["--cache-mb", "0"]), ("refused-resident", ["--no-stream"])):
            s = moestream_run(env, model, flags, tag)
            if s["rc"] == 0 or reason_of(s["err"], model).replace("error: ", "", 1) != res["reason"]:
                fail("inspect refuses the file (%s) but `run %s` says: exit %d %s"
                     % (res["reason"], " ".join(flags), s["rc"], s["err"]))
        res["seconds"] = round(time.monotonic() - t0, 2)
        return res
    info = json.loads(o)
    res["arch"] = info["arch"]
    res["layout"] = info["expert_layouts"]
    ref = moestream_run(env, model, ["--no-stream"], "ref")
    if ref["rc"] != 0:
        rc, o, e = llama_completion(env, model)
        if rc != 0:
            # Not streaming's to fix: llama.cpp's own tool fails on the file too.
            why = [x for x in e.decode("utf-8", "replace").splitlines()
                   if re.search(r"GGML_ASSERT|\.(c|cpp):\d+: |error", x)]
            res["reason"] = "llama.cpp fails on this file too (llama-completion exit %d: %s)" % (
                rc, re.sub(r"^[^:]*/src/", "src/", why[0].strip()) if why else "no message")
        else:
            fail("--no-stream failed, llama-completion did not: " + ref["err"])
        res["seconds"] = round(time.monotonic() - t0, 2)
        return res
    if len(ref["tokens"]) != N_PREDICT:
        fail("--no-stream generated %d tokens, want %d" % (len(ref["tokens"]), N_PREDICT))
    moe = [l["layer"] for l in info["moe_layers"]]
    adjacent = any(b == a + 1 for a, b in zip(moe, moe[1:]))
    small = str(max(1, -(-info["token_working_set_bytes"] // (1 << 20))))
    for tag, flags in VARIANTS:
        s = moestream_run(env, model, [small if f == "SMALL" else f for f in flags], tag)
        if s["rc"] != 0:
            if tag == "cache-off" and "llama.cpp's graph" in s["err"]:
                # Accepted by the index, refused at the first graph: the file's expert
                # tensors are not the ones llama.cpp computes with.
                res["reason"] = reason_of(s["err"], model).replace("error: ", "", 1)
                break
            fail("%s: exit %d: %s" % (tag, s["rc"], s["err"]))
            continue
        res["streams"] = True
        if not s["stats"]["settings"]["stream"]:
            fail("%s: did not stream" % tag)
        for k in ("tokens", "logits_sha", "logits"):
            if s[k] != ref[k]:
                fail("%s: %s differ from --no-stream" % (tag, k))
        if s["stats"]["flash_bytes_read"] <= 0:
            fail("%s: read no expert bytes" % tag)
        st = s["stats"]["settings"]
        if tag == "cache-off" and not (st["io_overlap"] and st["io_overlap_waits_at_input"] > 0):
            fail("cache-off: the down reads did not overlap the first matmuls")
        # Read-ahead guesses layer L+1 at layer L: only with two adjacent MoE layers.
        if tag == "prefetch" and adjacent and s["stats"]["prefetch_predictions"] <= 0:
            fail("prefetch: no predictions")
    if not res["streams"]:
        res["seconds"] = round(time.monotonic() - t0, 2)
        return res
    # llama-completion, greedy, same backend: its printed pieces are our text. Its log is
    # written by a worker thread that the process does not always drain at exit (more often
    # under load), so a run that printed less than our text and whose log lacks the final perf
    # line ("graph reallocs") lost its tail and is run again. A run with its whole log must
    # match exactly; if every run lost its tail, the longest must be a non-empty prefix of our
    # text (any token it did print agrees), noted in the results.
    want = ref["text"].rstrip("\n")
    longest, whole, rc = None, False, 0
    for _ in range(10):
        rc, o, e = llama_completion(env, model)
        if rc != 0:
            fail("llama-completion: exit %d: %s" % (rc, last_line(e)))
            break
        got = o.decode("utf-8", "replace").rstrip("\n")
        if got == want or b"graph reallocs" in e:
            longest, whole = got, True
            break
        if longest is None or len(got) > len(longest):
            longest = got
    if rc == 0 and longest is not None and longest != want:
        if whole or not longest or not want.startswith(longest):
            fail("llama-completion printed %r, moestream %r" % (longest[-80:], want[-80:]))
        else:
            res["note"] = ("llama-completion's log lost its tail in 10 runs; its longest output "
                           "(%d of %d characters) agrees" % (len(longest), len(want)))
    # Negative control: corrupting the first MoE layer's routed slices must change the output.
    layer = info["moe_layers"][0]["layer"] if info.get("moe_layers") else 0
    bad = moestream_run(env, model, ["--cache-mb", "0"], "corrupt",
                        {"MOESTREAM_DEBUG_CORRUPT_EXPERT": "%d:*" % layer})
    if bad["rc"] == 0:
        if bad["logits_sha"] == ref["logits_sha"] and bad["logits"] == ref["logits"]:
            fail("negative control: corrupting layer %d's experts did not change the logits" % layer)
    elif not (bad["rc"] == 1 and "non-finite logit" in bad["err"]):
        fail("negative control: exit %d: %s" % (bad["rc"], bad["err"]))
    res["seconds"] = round(time.monotonic() - t0, 2)
    return res


def cmd_run(argv):
    out, jobs, only, keep = None, 2, "", False
    it = iter(argv)
    for a in it:
        if a == "--keep":
            keep = True
        elif a == "--jobs":
            jobs = int(next(it))
        elif a == "--only":
            only = next(it)
        else:
            out = a
    if not out:
        sys.stderr.write(__doc__)
        return 64
    env = tool_env()
    t0 = time.monotonic()
    cases = make_models(out, env, only)
    if not cases:
        print("arch_matrix: no architecture matches --only %r" % only)
        return 1
    def one(c):
        r = check_case(c, env)
        if not r["failures"] and not keep and os.path.exists(c["model"]):
            os.remove(c["model"])  # a failing architecture's model stays for a look
        return r

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
        results = list(ex.map(one, cases))
    wall = round(time.monotonic() - t0, 1)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump({"n_predict": N_PREDICT, "variants": [v[0] for v in VARIANTS],
                   "wall_s": wall, "results": results}, f, indent=1)
    bad = 0
    for r in results:
        state = "streams" if r["streams"] else "refused: " + r["reason"] if r["reason"] else "?"
        print("%-22s %-60s %s" % (r["name"], state[:60], "FAIL" if r["failures"] else "ok"))
        for x in r["failures"]:
            print("    " + x)
        if r.get("note"):
            print("    note: " + r["note"])
        bad += bool(r["failures"])
    n_stream = sum(r["streams"] for r in results)
    print("arch_matrix: %d architectures, %d stream, %d refused, %d failed; %.1f s"
          % (len(results), n_stream, len(results) - n_stream, bad, wall))
    return 1 if bad else 0


def render(results):
    # One row per architecture; its quantized copies ("<name>@<type>") are a column.
    ok, types = [], {}
    for r in sorted(results["results"], key=lambda r: r["name"]):
        if r["streams"]:
            base, _, q = r["name"].partition("@")
            if base not in types:
                ok.append(dict(r, name=base))
                types[base] = []
            types[base].append(q or "F32")
    no = sorted((r for r in results["results"] if not r["streams"]), key=lambda r: r["name"])
    L = ["# Architectures",
         "",
         "<!-- Generated by tests/tools/arch_matrix.py doc from a gate_arch_matrix run;"
         " do not edit by hand. -->",
         "",
         "Which MoE architectures stream, checked on llama.cpp's own tiny test models"
         " (`test-llama-archs`, from Debian's llama.cpp-tests package) reshaped to 8 experts"
         " top-2 by `tests/tools/moe_rewrite.py`, as F32 and quantized by Debian's"
         " `llama-quantize` (Q4_K_M: q4_K gate/up with q5_0 or q8_0 down, every architecture;"
         " MXFP4_MOE for one architecture per expert layout and gpt-oss). For each file that"
         " streams, streaming"
         " with the cache off, with a small forced cache and with `--prefetch` gives the same"
         " token ids and logits as `--no-stream` and the same tokens as `llama-completion`,"
         " and corrupting one layer's expert slices changes the output (the negative control)."
         " `nemotron_h_moe-gateless` is made from llama.cpp's dense nemotron_h_moe test model"
         " (its experts have no gate: up and down only); `qwen3moe-split` is the qwen3moe"
         " model split into shards by Debian's `llama-gguf-split` (run from the first shard);"
         " `glm4moe-nextn` is a `moestream synth` glm4moe file that keeps a NextN layer, which"
         " llama.cpp does not build. The reasons in the second table are"
         " moestream's messages on those test files, whose metadata is llama.cpp's defaults.",
         "",
         "`moestream inspect -m FILE` says for any file whether it streams (docs/inspect.md).",
         "To check this list on your machine: `ctest --test-dir build -R gate_arch_matrix`"
         " (about two minutes on 2 cores); it fails when the run differs from this page, which"
         " `tests/tools/arch_matrix.py doc build/test-models/archs/results.json"
         " docs/architectures.md` regenerates.",
         "",
         "## Stream (%d)" % len(ok),
         "",
         "| architecture | expert tensors | file types streamed |",
         "|---|---|---|"]
    for r in ok:
        L.append("| %s | %s | %s |" % (r["name"], r.get("layout", ""), ", ".join(types[r["name"]])))
    L += ["", "## Do not stream (%d)" % len(no), ""]
    if no:
        L += ["| architecture | why (moestream's message) |", "|---|---|"]
        for r in no:
            L.append("| %s | %s |" % (r["name"], (r["reason"] or "; ".join(r["failures"])).replace("|", "\\|")))
    else:
        L.append("None.")
    L.append("")
    return "\n".join(L)


def main(argv):
    if len(argv) >= 2 and argv[1] == "run":
        return cmd_run(argv[2:])
    if len(argv) == 4 and argv[1] in ("doc", "check"):
        with open(argv[2]) as f:
            text = render(json.load(f))
        if argv[1] == "doc":
            with open(argv[3], "w") as f:
                f.write(text)
            return 0
        try:
            with open(argv[3]) as f:
                have = f.read()
        except OSError as e:
            have = ""
            print("arch_matrix: %s" % e)
        if have != text:
            import difflib
            sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), text.splitlines(True),
                                                       argv[3], "from " + argv[2]))
            print("arch_matrix: %s does not match the run; regenerate it with:\n"
                  "  tests/tools/arch_matrix.py doc %s %s" % (argv[3], argv[2], argv[3]))
            return 1
        return 0
    sys.stderr.write(__doc__)
    return 64


if __name__ == "__main__":
    sys.exit(main(sys.argv))
