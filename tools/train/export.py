#!/usr/bin/env python3
"""Export a training checkpoint (tools/train/train.py) to a qwen3moe GGUF (F32 tensors),
loadable by llama.cpp 0.7.0; quantize it afterwards with llama-quantize (tools/train/run.sh).

  export.py --ckpt RUNDIR/ckpt.pt -o MODEL-f32.gguf [--name NAME]

Uses the gguf Python package from Debian's python3-gguf (extracted by scripts/setup-train.sh
into .deps/python; PYTHONPATH is set by tools/train/py). Tokenizer: "gpt2" with the 256
GPT-2 byte-level strings (token id b = byte b) and no merges, so llama.cpp maps every byte to
its own token; then <|endoftext|> (bos/eos/pad), <|im_start|>, <|im_end|> as control tokens.
The gguf writer silently skips an empty array in add_array() (and raises on one in
_pack_val), but llama.cpp 0.7.0 refuses a gpt2 vocab without tokenizer.ggml.merges
("cannot find tokenizer merges"): EmptyArrayWriter writes the empty string array itself.
"""
import argparse, os, sys

import numpy as np
import torch
import gguf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, gguf_tensor_map  # noqa: E402

ARCH = "qwen3moe"


def byte_tokens():
    """GPT-2's bytes_to_unicode: printable bytes map to themselves, the rest to 256+n."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    table, n = {}, 0
    for b in range(256):
        if b in keep:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


class EmptyArrayWriter(gguf.GGUFWriter):
    def _pack_val(self, val, vtype, add_vtype, sub_type=None):
        if vtype == gguf.GGUFValueType.ARRAY and len(val) == 0:
            if sub_type is None:
                raise ValueError("an empty GGUF array needs an explicit element type")
            out = bytearray()
            if add_vtype:
                out += self._pack("I", vtype)
            out += self._pack("I", sub_type)
            out += self._pack("Q", 0)
            return bytes(out)
        return super()._pack_val(val, vtype, add_vtype, sub_type)

    def add_empty_array(self, key, sub_type):
        self.add_key_value(key, [], gguf.GGUFValueType.ARRAY, sub_type=sub_type)


def f32(t):
    return t.detach().to(torch.float32).contiguous().numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--name", default="moestream-trained qwen3moe byte-level (linux-doc)")
    a = ap.parse_args()
    ck = torch.load(a.ckpt, map_location="cpu")
    c = Config(**ck["config"])
    sd = ck["model"]

    w = EmptyArrayWriter(a.output, ARCH)
    w.add_name(a.name)
    w.add_type("model")
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_context_length(c.n_ctx_train)
    w.add_block_count(c.n_layer)
    w.add_embedding_length(c.n_embd)
    w.add_feed_forward_length(c.n_ff_exp)
    w.add_head_count(c.n_head)
    w.add_head_count_kv(c.n_head_kv)
    w.add_key_length(c.head_dim)
    w.add_value_length(c.head_dim)
    w.add_layer_norm_rms_eps(c.rms_eps)
    w.add_rope_freq_base(c.rope_base)
    w.add_rope_dimension_count(c.head_dim)
    w.add_expert_count(c.n_expert)
    w.add_expert_used_count(c.n_expert_used)
    w.add_expert_feed_forward_length(c.n_ff_exp)
    w.add_uint32("moestream.train.step", int(ck["step"]))
    w.add_uint64("moestream.train.tokens", int(ck["tokens_seen"]))

    toks = byte_tokens() + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    assert len(toks) == c.n_vocab, (len(toks), c.n_vocab)
    types = [gguf.TokenType.NORMAL] * 256 + [gguf.TokenType.CONTROL] * 3
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(toks)
    w.add_token_types(types)
    w.add_empty_array(gguf.Keys.Tokenizer.MERGES, gguf.GGUFValueType.STRING)
    w.add_bos_token_id(256)
    w.add_eos_token_id(256)
    w.add_pad_token_id(256)
    w.add_add_bos_token(False)

    for name, key in gguf_tensor_map(c):
        w.add_tensor(name, f32(sd[key]))

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"wrote {a.output}: {os.path.getsize(a.output)} bytes (step {ck['step']})")


if __name__ == "__main__":
    main()
