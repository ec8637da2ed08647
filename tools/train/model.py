"""The qwen3moe graph of llama.cpp, in PyTorch (training and reference side).

Per layer, exactly what llama.cpp 0.7.0 builds for LLM_ARCH_QWEN3MOE:
  h   = RMSNorm(x) * attn_norm
  q,k,v = h Wq, h Wk, h Wv            (GQA: n_head_kv < n_head)
  q,k = RMSNorm_per_head(q) * attn_q_norm, RMSNorm_per_head(k) * attn_k_norm
  q,k = RoPE NEOX (pairs i, i + head_dim/2), theta_i = pos * freq_base^(-2i/head_dim)
  x   = x + softmax(q k^T / sqrt(head_dim), causal) v Wo
  h   = RMSNorm(x) * ffn_norm
  p   = softmax(h Wr)                 (router over n_expert)
  top-k of p (ids by descending p), weights w = p[top] / sum(p[top])   (norm_topk_prob)
  x   = x + sum_j w_j * down_j(silu(gate_j h) * up_j h)    (SwiGLU experts, no shared expert)
out = RMSNorm(x) * output_norm, logits = out W_output (untied).
Byte-level vocabulary: token id b = byte b (0..255), then control tokens.
"""
import math
from dataclasses import dataclass, asdict

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass
class Config:
    n_vocab: int = 259          # 256 bytes + <|endoftext|>, <|im_start|>, <|im_end|>
    n_layer: int = 4
    n_embd: int = 256
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 64
    n_expert: int = 32
    n_expert_used: int = 4
    n_ff_exp: int = 256
    rms_eps: float = 1e-6
    rope_base: float = 10000.0
    n_ctx_train: int = 512

    def to_dict(self):
        return asdict(self)


def rms_norm(x, w, eps):
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)) * w


def rope_neox(x, pos, base):
    """x [B, T, H, D]; NEOX rotation: pairs (i, i + D/2)."""
    d = x.shape[-1]
    half = d // 2
    inv = base ** (-torch.arange(0, half, dtype=torch.float32) * 2.0 / d)
    ang = pos.float()[:, None] * inv[None, :]          # [T, half]
    cos = ang.cos()[None, :, None, :]
    sin = ang.sin()[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


class Block(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        E, D = c.n_embd, c.head_dim
        self.attn_norm = nn.Parameter(torch.ones(E))
        self.wq = nn.Linear(E, c.n_head * D, bias=False)
        self.wk = nn.Linear(E, c.n_head_kv * D, bias=False)
        self.wv = nn.Linear(E, c.n_head_kv * D, bias=False)
        self.wo = nn.Linear(c.n_head * D, E, bias=False)
        self.q_norm = nn.Parameter(torch.ones(D))
        self.k_norm = nn.Parameter(torch.ones(D))
        self.ffn_norm = nn.Parameter(torch.ones(E))
        self.router = nn.Linear(E, c.n_expert, bias=False)
        X, Fd = c.n_expert, c.n_ff_exp
        self.w_gate = nn.Parameter(torch.empty(X, Fd, E))   # gguf ffn_gate_exps ne [E, F, X]
        self.w_up = nn.Parameter(torch.empty(X, Fd, E))     # gguf ffn_up_exps   ne [E, F, X]
        self.w_down = nn.Parameter(torch.empty(X, E, Fd))   # gguf ffn_down_exps ne [F, E, X]

    def attention(self, x, pos):
        c = self.c
        B, T, _ = x.shape
        h = rms_norm(x, self.attn_norm, c.rms_eps)
        q = self.wq(h).view(B, T, c.n_head, c.head_dim)
        k = self.wk(h).view(B, T, c.n_head_kv, c.head_dim)
        v = self.wv(h).view(B, T, c.n_head_kv, c.head_dim)
        q = rope_neox(rms_norm(q, self.q_norm, c.rms_eps), pos, c.rope_base)
        k = rope_neox(rms_norm(k, self.k_norm, c.rms_eps), pos, c.rope_base)
        rep = c.n_head // c.n_head_kv            # head h uses kv head h // rep (llama.cpp GQA)
        k = k.repeat_interleave(rep, dim=2)
        v = v.repeat_interleave(rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))   # [B, H, T, D]
        att = (q @ k.transpose(-1, -2)) / math.sqrt(c.head_dim)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        att = att.masked_fill(mask, float("-inf")).softmax(-1)
        o = (att @ v).transpose(1, 2).reshape(B, T, c.n_head * c.head_dim)
        return self.wo(o)

    def moe(self, x, k_used=None):
        c = self.c
        k = k_used or c.n_expert_used
        B, T, E = x.shape
        h = rms_norm(x, self.ffn_norm, c.rms_eps).reshape(B * T, E)
        probs = self.router(h).softmax(-1)                         # [N, X]
        w, ids = probs.topk(k, dim=-1)                             # descending
        w = w / w.sum(-1, keepdim=True).clamp(min=6.103515625e-5)  # ffn_moe_weights_norm
        N = h.shape[0]
        flat = ids.reshape(-1)
        order = flat.argsort()
        tok = torch.arange(N).repeat_interleave(k)[order]
        wsorted = w.reshape(-1)[order]
        counts = torch.bincount(flat, minlength=c.n_expert).tolist()
        # Grouped by expert into a zero-padded [n_expert, max_count, E] buffer: three bmm per
        # layer instead of 3 x n_expert small matmuls (padding rows are zero and get no gradient).
        sorted_ids = flat[order]
        offsets = torch.zeros(c.n_expert, dtype=torch.long)
        offsets[1:] = torch.tensor(counts[:-1]).cumsum(0)
        slot = torch.arange(N * k) - offsets[sorted_ids]
        cap = max(counts)
        buf = h.new_zeros(c.n_expert, cap, E).index_put((sorted_ids, slot), h[tok])
        g = torch.bmm(buf, self.w_gate.transpose(1, 2))
        u = torch.bmm(buf, self.w_up.transpose(1, 2))
        yb = torch.bmm(F.silu(g) * u, self.w_down.transpose(1, 2))
        y = yb[sorted_ids, slot] * wsorted[:, None]
        out = torch.zeros_like(h).index_add_(0, tok, y)
        # Switch-style load balancing: n_expert * sum_e (fraction of slots to e) * (mean prob of e)
        frac = torch.tensor(counts, dtype=torch.float32) / float(N * k)
        aux = c.n_expert * (frac * probs.mean(0)).sum()
        return out.view(B, T, E), aux, ids.view(B, T, k)

    def forward(self, x, pos, k_used=None):
        x = x + self.attention(x, pos)
        m, aux, ids = self.moe(x, k_used)
        return x + m, aux, ids


class Qwen3Moe(nn.Module):
    def __init__(self, c: Config):
        super().__init__()
        self.c = c
        self.tok_embd = nn.Embedding(c.n_vocab, c.n_embd)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.n_layer))
        self.out_norm = nn.Parameter(torch.ones(c.n_embd))
        self.output = nn.Linear(c.n_embd, c.n_vocab, bias=False)
        self.reset_parameters()

    def reset_parameters(self, seed=None):
        c = self.c
        std = 0.02
        resid = std / math.sqrt(2 * c.n_layer)
        nn.init.normal_(self.tok_embd.weight, std=std)
        nn.init.normal_(self.output.weight, std=std)
        for b in self.blocks:
            for lin in (b.wq, b.wk, b.wv, b.router):
                nn.init.normal_(lin.weight, std=std)
            nn.init.normal_(b.wo.weight, std=resid)
            nn.init.normal_(b.w_gate, std=std)
            nn.init.normal_(b.w_up, std=std)
            nn.init.normal_(b.w_down, std=resid)

    def forward(self, idx, k_used=None, return_routes=False):
        B, T = idx.shape
        pos = torch.arange(T)
        x = self.tok_embd(idx)
        aux_total = x.new_zeros(())
        routes = []
        for b in self.blocks:
            x, aux, ids = b(x, pos, k_used)
            aux_total = aux_total + aux
            routes.append(ids)
        logits = self.output(rms_norm(x, self.out_norm, self.c.rms_eps))
        if return_routes:
            return logits, aux_total / len(self.blocks), routes
        return logits, aux_total / len(self.blocks)


# GGUF tensor name (llama.cpp's qwen3moe) <-> state_dict key, shared by export.py and
# reference.py. numpy/torch shapes are the reverse of GGUF's ne[] (e.g. ffn_gate_exps
# ne [n_embd, n_ff_exp, n_expert] is torch [n_expert, n_ff_exp, n_embd]).
LAYER_TENSORS = (("attn_norm.weight", "attn_norm"), ("attn_q.weight", "wq.weight"),
                 ("attn_k.weight", "wk.weight"), ("attn_v.weight", "wv.weight"),
                 ("attn_output.weight", "wo.weight"), ("attn_q_norm.weight", "q_norm"),
                 ("attn_k_norm.weight", "k_norm"), ("ffn_norm.weight", "ffn_norm"),
                 ("ffn_gate_inp.weight", "router.weight"), ("ffn_gate_exps.weight", "w_gate"),
                 ("ffn_up_exps.weight", "w_up"), ("ffn_down_exps.weight", "w_down"))


def gguf_tensor_map(c: Config):
    """[(gguf name, state_dict key)] in the order export.py writes them."""
    out = [("token_embd.weight", "tok_embd.weight")]
    for i in range(c.n_layer):
        out += [(f"blk.{i}.{g}", f"blocks.{i}.{m}") for g, m in LAYER_TENSORS]
    return out + [("output_norm.weight", "out_norm"), ("output.weight", "output.weight")]
