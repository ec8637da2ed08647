#!/usr/bin/env python3
"""moe_rewrite.py IN OUT [--experts N] [--used K] [--gateless-from-dense] — reshape a small MoE
GGUF (one of llama.cpp's test-llama-archs models) into a streaming test model.

  --experts N   (default 8) every MoE layer gets N experts: each tensor with an expert axis
                (blk.L.ffn_{gate,up,down,gate_up}_exps.*, ffn_*_chexps.*, ffn_gate_inp.*,
                exp_probs_b*) grows from the file's expert count to N along that (outermost)
                axis; the new experts are the old ones with their values rotated (expert e is
                expert e % n_old rotated by e // n_old steps), so every expert differs.
                A file that already has >= N experts keeps them.
  --used K      (default 2) <arch>.expert_used_count = K.
  --gateless-from-dense
                for an architecture whose experts have no gate (up/down only, e.g.
                nemotron_h_moe): turn each dense FFN layer (blk.L.ffn_up / ffn_down, no
                ffn_gate) into a MoE layer: the dense up/down become the shared expert
                (ffn_*_shexp), N up/down routed experts (rotated copies of it), a router
                (ffn_gate_inp) and its bias (exp_probs_b); the expert keys follow.

Only f32/f16/bf16 tensors are rewritten (what test-llama-archs writes); any other type of an
expert-axis tensor is an error. Standard library only (the GGUF reader/writer of
gguf_mutate.py). Exit 0 on success, 2 on bad input (one line naming it).
"""
import os
import re
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gguf_mutate as g  # noqa: E402

ELEM = {0: 4, 1: 2, 30: 2}  # f32, f16, bf16: bytes per element
EXPERT_AXIS = re.compile(
    r"^blk\.\d+\.(ffn_(gate|up|down|gate_up)_(ch)?exps\.(weight|bias|scale|input_scale)"
    r"|ffn_gate_inp\.(weight|bias)|exp_probs_b(_vl)?(\.bias)?)$")


def nbytes(ne, typ, name):
    if typ not in ELEM:
        raise g.Bad("tensor '%s' has ggml type %d (only f32/f16/bf16 are rewritten)" % (name, typ))
    n = ELEM[typ]
    for d in ne:
        n *= d
    return n


def rotate(chunk, steps, esize):
    """chunk's elements rotated left by steps * a prime stride (identity for one element)."""
    n = len(chunk) // esize
    if n <= 1 or steps == 0:
        return chunk
    k = (steps * 7919) % n or 1
    return chunk[k * esize:] + chunk[:k * esize]


def grow(data, ne, typ, name, n_old, n_new):
    """Grows the outermost (expert) axis from n_old to n_new."""
    total = nbytes(ne, typ, name)
    per = total // n_old
    out = bytearray(data[:total])
    for e in range(n_old, n_new):
        out += rotate(data[(e % n_old) * per:(e % n_old + 1) * per], e // n_old, ELEM[typ])
    return bytes(out), ne[:-1] + [n_new]


def set_u32(kvs, key, v):
    kv = g.find_kv(kvs, key.encode())
    if kv and kv[1] == g.T_ARR:
        raise g.Bad("key '%s' is an array" % key)
    if kv:
        kv[1], kv[2] = g.T_U32, v
    else:
        kvs.append([key.encode(), g.T_U32, v])


def rewrite(st, n_new, used, gateless):
    ver, kvs, tensors, data = st
    a = g.arch(kvs)
    if not a:
        raise g.Bad("no general.architecture")
    kv = g.find_kv(kvs, (a + ".expert_count").encode())
    n_old = kv[2] if kv and kv[1] != g.T_ARR else 0
    blobs = []  # (name, ne, type, bytes)
    for name, ne, typ, off in tensors:
        blobs.append([name, list(ne), typ, data[off:off + nbytes(ne, typ, name.decode())]])
    if gateless:
        if n_old:
            raise g.Bad("--gateless-from-dense wants a dense file; this one has %d experts" % n_old)
        by_name = {b[0]: b for b in blobs}
        layers = sorted({int(m.group(1)) for b in blobs
                         for m in [re.match(rb"^blk\.(\d+)\.ffn_up\.weight$", b[0])] if m})
        if not layers:
            raise g.Bad("--gateless-from-dense: no blk.N.ffn_up.weight in the file")
        n_ff = 0
        out = []
        for b in blobs:
            m = re.match(rb"^blk\.(\d+)\.ffn_(up|down|gate)\.(weight|bias|scale|input_scale)$", b[0])
            if not m or int(m.group(1)) not in layers:
                out.append(b)
                continue
            il, proj, kind = int(m.group(1)), m.group(2).decode(), m.group(3).decode()
            if proj == "gate":
                raise g.Bad("--gateless-from-dense: layer %d has ffn_gate" % il)
            if kind != "weight":
                continue  # dense biases and scales have no expert form here
            if proj == "up":
                n_ff = b[1][1]
            # The dense FFN becomes the shared expert; the routed experts are rotated copies.
            out.append([b"blk.%d.ffn_%s_shexp.weight" % (il, proj.encode()), b[1], b[2], b[3]])
            name = "blk.%d.ffn_%s_exps.weight" % (il, proj)
            d, ne = grow(b[3], b[1] + [1], b[2], name, 1, n_new)
            out.append([name.encode(), ne, b[2], d])
            if proj == "up":
                n_embd = b[1][0]
                router = bytearray()
                for e in range(n_new):  # a deterministic, expert-distinct router
                    for i in range(n_embd):
                        router += struct.pack("<f", (((e * 131 + i * 71) % 97) - 48) / 480.0)
                out.append([b"blk.%d.ffn_gate_inp.weight" % il, [n_embd, n_new], 0, bytes(router)])
                out.append([b"blk.%d.exp_probs_b.bias" % il, [n_new], 0, b"\0" * 4 * n_new])
        blobs = out
        set_u32(kvs, a + ".expert_count", n_new)
        set_u32(kvs, a + ".expert_feed_forward_length", n_ff)
        set_u32(kvs, a + ".expert_shared_feed_forward_length", n_ff)
        set_u32(kvs, a + ".expert_shared_count", 1)
        n_old = n_new
    elif not n_old:
        raise g.Bad("%s.expert_count is missing or 0 (not a MoE file)" % a)
    if n_old < n_new:
        for b in blobs:
            if EXPERT_AXIS.match(b[0].decode("utf-8", "replace")) and b[1] and b[1][-1] == n_old:
                b[3], b[1] = grow(b[3], b[1], b[2], b[0].decode(), n_old, n_new)
        set_u32(kvs, a + ".expert_count", n_new)
    set_u32(kvs, a + ".expert_used_count", used)
    kv = g.find_kv(kvs, b"general.alignment")
    align = kv[2] if kv and kv[1] == g.T_U32 and kv[2] > 0 else 32
    new_tensors, body = [], bytearray()
    for name, ne, typ, d in blobs:
        new_tensors.append([name, ne, typ, len(body)])
        body += d
        while len(body) % align:
            body += b"\0"
    return ver, kvs, new_tensors, bytes(body)


def main(argv):
    args, n_new, used, gateless = [], 8, 2, False
    it = iter(argv[1:])
    try:
        for x in it:
            if x == "--experts":
                n_new = int(next(it))
            elif x == "--used":
                used = int(next(it))
            elif x == "--gateless-from-dense":
                gateless = True
            else:
                args.append(x)
        if len(args) != 2 or n_new < 1 or not 1 <= used <= n_new:
            sys.stderr.write(__doc__)
            return 2
        with open(args[0], "rb") as f:
            st = g.parse(f.read())
        st = rewrite(st, n_new, used, gateless)
        with open(args[1], "wb") as f:
            f.write(g.build(st))
    except (g.Bad, OSError, ValueError, StopIteration) as e:
        sys.stderr.write("moe_rewrite: %s: %s\n" % (args[0] if args else "?", e))
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
