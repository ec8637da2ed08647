#!/usr/bin/env python3
"""Train the qwen3moe byte-level MoE (tools/train/model.py) on the corpus from corpus.py.

  train.py --data DIR --run RUNDIR [--max-steps N] [--max-minutes M] [options]

Resumable: RUNDIR/ckpt.pt (model + AdamW state + step + RNG-free sampling state) is written
atomically every --ckpt-minutes and on SIGINT/SIGTERM; starting again with the same RUNDIR
continues from it (--max-steps may be raised to train longer; the cosine schedule is always
computed against the current --max-steps). Batches are drawn from a numpy Generator seeded
by (seed, step), so a resumed run sees the batches an uninterrupted one would have.
SIGSTOP/SIGCONT only shift wall-clock figures (tokens/s in the log is wall-clock).
Log: RUNDIR/train.log.jsonl, one JSON object per line (kind: start, step, eval, ckpt, end).
"""
import argparse, json, math, os, signal, sys, time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Config, Qwen3Moe  # noqa: E402


def load_bytes(path):
    return np.frombuffer(open(path, "rb").read(), dtype=np.uint8)


def val_windows(val, ctx, n):
    starts = np.linspace(0, len(val) - ctx - 2, n).astype(np.int64)
    return torch.from_numpy(np.stack([val[s:s + ctx + 1] for s in starts]).astype(np.int64))


@torch.no_grad()
def evaluate(model, vw, bs=8):
    model.eval()
    tot, n = 0.0, 0
    for i in range(0, vw.shape[0], bs):
        b = vw[i:i + bs]
        logits, _ = model(b[:, :-1])
        tot += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 b[:, 1:].reshape(-1), reduction="sum").item()
        n += b[:, 1:].numel()
    model.train()
    return tot / n


def progress(step, secs, a):
    """Fraction of the run done: steps or wall time (--budget-minutes), whichever is further."""
    p = (step - a.warmup) / max(1, a.max_steps - a.warmup)
    if a.budget_minutes:
        p = max(p, secs / (a.budget_minutes * 60))
    return min(1.0, max(0.0, p))


def lr_at(step, secs, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    p = progress(step, secs, a)
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--run", required=True)
    ap.add_argument("--max-steps", type=int, default=20000)
    ap.add_argument("--max-minutes", type=float, default=0, help="stop (with a checkpoint) after this much wall time in this invocation; 0 = no limit")
    ap.add_argument("--budget-minutes", type=float, default=0, help="total training wall time of the run (all invocations) over which the cosine schedule decays; the run ends when it is used up; 0 = schedule by --max-steps only")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--ctx", type=int, default=256)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.05)
    ap.add_argument("--aux-coef", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--log-every", type=int, default=10)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--val-windows", type=int, default=32)
    ap.add_argument("--ckpt-minutes", type=float, default=5)
    ap.add_argument("--pid-file", default="")
    # model shape (only used when starting a new run; a resumed run keeps its own)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-expert", type=int, default=32)
    ap.add_argument("--n-expert-used", type=int, default=4)
    ap.add_argument("--n-ff-exp", type=int, default=256)
    a = ap.parse_args()

    torch.set_num_threads(a.threads)
    if a.pid_file:
        with open(a.pid_file, "w") as f:
            f.write(f"{os.getpid()}\n")
    os.makedirs(a.run, exist_ok=True)
    log = open(os.path.join(a.run, "train.log.jsonl"), "a", buffering=1)

    def emit(kind, **kw):
        rec = {"kind": kind, "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **kw}
        log.write(json.dumps(rec) + "\n")
        print(json.dumps(rec), flush=True)

    train = load_bytes(os.path.join(a.data, "train.txt"))
    val = load_bytes(os.path.join(a.data, "val.txt"))
    ckpt_path = os.path.join(a.run, "ckpt.pt")
    if os.path.exists(ckpt_path):
        ck = torch.load(ckpt_path)
        cfg = Config(**ck["config"])
        model = Qwen3Moe(cfg)
        model.load_state_dict(ck["model"])
        step = ck["step"]
        tokens_seen = ck["tokens_seen"]
        secs_done = ck.get("train_seconds", 0.0)
    else:
        cfg = Config(n_layer=a.n_layer, n_embd=a.n_embd, n_expert=a.n_expert,
                     n_expert_used=a.n_expert_used, n_ff_exp=a.n_ff_exp)
        torch.manual_seed(a.seed)
        model = Qwen3Moe(cfg)
        ck, step, tokens_seen, secs_done = None, 0, 0, 0.0
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    if ck is not None:
        opt.load_state_dict(ck["opt"])
    nparams = sum(p.numel() for p in model.parameters())
    emit("start", step=step, config=cfg.to_dict(), args=vars(a), params=nparams,
         train_bytes=int(len(train)), val_bytes=int(len(val)),
         torch=torch.__version__, blas=torch.__config__.show().count("BLAS"))

    vw = val_windows(val, a.ctx, a.val_windows)
    stop = {"flag": False}

    def on_signal(sig, _):
        stop["flag"] = True
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    def save():
        tmp = ckpt_path + ".tmp"
        torch.save({"config": cfg.to_dict(), "model": model.state_dict(), "opt": opt.state_dict(),
                    "step": step, "tokens_seen": tokens_seen, "args": vars(a),
                    "train_seconds": secs()}, tmp)
        os.replace(tmp, ckpt_path)
        emit("ckpt", step=step, path=ckpt_path)

    t_start = time.time()

    def secs():
        return secs_done + time.time() - t_start
    t_ckpt = time.time()
    t_log, tok_log = time.time(), 0
    cpu_log = time.process_time()
    loss_acc, aux_acc, n_acc = 0.0, 0.0, 0
    model.train()
    while step < a.max_steps and not stop["flag"] and not (a.budget_minutes and secs() >= a.budget_minutes * 60):
        rng = np.random.default_rng([a.seed, step])
        starts = rng.integers(0, len(train) - a.ctx - 1, size=a.batch)
        b = torch.from_numpy(np.stack([train[s:s + a.ctx + 1] for s in starts]).astype(np.int64))
        for g in opt.param_groups:
            g["lr"] = lr_at(step, secs(), a)
        logits, aux = model(b[:, :-1])
        ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))
        loss = ce + a.aux_coef * aux
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        tokens_seen += a.batch * a.ctx
        tok_log += a.batch * a.ctx
        loss_acc += ce.item(); aux_acc += aux.item(); n_acc += 1
        if step % a.log_every == 0:
            now = time.time()
            emit("step", step=step, loss=round(loss_acc / n_acc, 4), aux=round(aux_acc / n_acc, 4),
                 lr=round(lr_at(step - 1, secs(), a), 6), tok_s=round(tok_log / (now - t_log), 1),
                 tok_s_cpu=round(tok_log / max(1e-9, time.process_time() - cpu_log), 1),
                 tokens=tokens_seen)
            t_log, tok_log, cpu_log = now, 0, time.process_time()
            loss_acc, aux_acc, n_acc = 0.0, 0.0, 0
        if step % a.eval_every == 0:
            emit("eval", step=step, val_loss=round(evaluate(model, vw), 4))
        if time.time() - t_ckpt > a.ckpt_minutes * 60:
            save()
            t_ckpt = time.time()
        if a.max_minutes and time.time() - t_start > a.max_minutes * 60:
            break
    vl = evaluate(model, vw)
    save()
    reason = ("signal" if stop["flag"] else "max_steps" if step >= a.max_steps
              else "budget_minutes" if a.budget_minutes and secs() >= a.budget_minutes * 60 else "max_minutes")
    emit("end", step=step, val_loss=round(vl, 4), tokens=tokens_seen, train_seconds=round(secs(), 1),
         reason=reason)


if __name__ == "__main__":
    main()
