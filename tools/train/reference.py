#!/usr/bin/env python3
"""PyTorch side of the llama.cpp equivalence test (tests/gates/trained_model.sh).

  reference.py -m MODEL.gguf -f TEXT [--ctx 256] [--prompt P] [--n-predict N] [-o OUT.json]

Loads any qwen3moe GGUF written by export.py (F32, or quantized: tensors are dequantized
with the gguf package's own dequantize, i.e. the exact values llama.cpp multiplies by) into
tools/train/model.py, then computes
  * perplexity the way llama-perplexity does: the text's bytes are the tokens (no BOS: the
    vocab says add_bos_token false), cut into len // ctx chunks of ctx tokens; in each chunk
    the tokens after position ctx/2 are scored (positions ctx/2 .. ctx-2 predict the next);
    PPL = exp(mean NLL over all scored tokens);
  * greedy decoding of --n-predict tokens after --prompt (argmax over the full vocab).
Writes a JSON object (stdout, or -o).
"""
import argparse, hashlib, json, math, os, sys

import numpy as np
import torch
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Qwen3Moe, gguf_tensor_map  # noqa: E402


def field(r, key):
    f = r.fields[key]
    v = f.parts[f.data[0]]
    return v.tobytes().decode() if f.types[0] == gguf.GGUFValueType.STRING else v.item()


def load_gguf(path):
    r = gguf.GGUFReader(path)
    A = "qwen3moe"
    c = Config(n_vocab=len(r.fields["tokenizer.ggml.tokens"].data),
               n_layer=field(r, f"{A}.block_count"), n_embd=field(r, f"{A}.embedding_length"),
               n_head=field(r, f"{A}.attention.head_count"),
               n_head_kv=field(r, f"{A}.attention.head_count_kv"),
               head_dim=field(r, f"{A}.attention.key_length"),
               n_expert=field(r, f"{A}.expert_count"),
               n_expert_used=field(r, f"{A}.expert_used_count"),
               n_ff_exp=field(r, f"{A}.expert_feed_forward_length"),
               rms_eps=field(r, f"{A}.attention.layer_norm_rms_epsilon"),
               rope_base=field(r, f"{A}.rope.freq_base"),
               n_ctx_train=field(r, f"{A}.context_length"))
    t = {}
    for ti in r.tensors:
        arr = gguf.quants.dequantize(ti.data, ti.tensor_type)
        shape = tuple(int(x) for x in reversed(ti.shape.tolist()))  # numpy order
        t[ti.name] = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32).reshape(shape))
    sd = {key: t[name] for name, key in gguf_tensor_map(c)}
    model = Qwen3Moe(c)
    model.load_state_dict(sd)
    model.eval()
    return model, c


@torch.no_grad()
def perplexity(model, toks, ctx, batch=8):
    n_chunk = len(toks) // ctx
    if n_chunk < 2:
        raise SystemExit(f"reference: need at least 2*ctx = {2 * ctx} tokens, have {len(toks)}")
    first = ctx // 2
    chunks = torch.tensor(toks[:n_chunk * ctx], dtype=torch.long).view(n_chunk, ctx)
    nll, n = 0.0, 0
    for i in range(0, n_chunk, batch):
        b = chunks[i:i + batch]
        logits, _ = model(b)
        lp = torch.log_softmax(logits[:, first:ctx - 1].double(), -1)
        tgt = b[:, first + 1:ctx]
        nll -= lp.gather(-1, tgt[..., None]).sum().item()
        n += tgt.numel()
    return math.exp(nll / n), n_chunk, n


@torch.no_grad()
def greedy(model, prompt, n):
    toks = list(prompt)
    out = []
    for _ in range(n):
        logits, _ = model(torch.tensor([toks], dtype=torch.long))
        nxt = int(logits[0, -1].argmax())
        toks.append(nxt)
        out.append(nxt)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("-m", "--model", required=True)
    ap.add_argument("-f", "--file", required=True)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--prompt", default="The kernel")
    ap.add_argument("--n-predict", type=int, default=64)
    ap.add_argument("-o", "--output", default="")
    a = ap.parse_args()
    torch.set_num_threads(2)
    model, c = load_gguf(a.model)
    text = open(a.file, "rb").read()
    ppl, n_chunk, n_scored = perplexity(model, list(text), a.ctx)
    g = greedy(model, a.prompt.encode(), a.n_predict)
    res = {"model": os.path.basename(a.model),
           "model_sha256": hashlib.sha256(open(a.model, "rb").read()).hexdigest(),
           "text": os.path.basename(a.file),
           "text_sha256": hashlib.sha256(text).hexdigest(),
           "ctx": a.ctx, "chunks": n_chunk, "scored_tokens": n_scored, "ppl": ppl,
           "prompt": a.prompt, "n_predict": a.n_predict, "greedy_tokens": g,
           "greedy_text": bytes(t for t in g if t < 256).decode("utf-8", errors="replace")}
    s = json.dumps(res, indent=1)
    if a.output:
        open(a.output, "w").write(s + "\n")
    print(s)


if __name__ == "__main__":
    main()
