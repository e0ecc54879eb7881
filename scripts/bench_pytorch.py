#!/usr/bin/python3
"""P1 and P2 of `tinylm bench`, written in PyTorch from Python, and the ratios.

Runs the same training loops as tinylm's P1 (the reference run: TinyAttentionLM,
vocab 64, d 32, 4 heads, seq 12, batch 16, Adam) and P2 (4 pre-LN blocks, d 256,
8 heads, seq 128, batch 16, vocab 256, AdamW) with Debian's python3-torch (the same
LibTorch 1.13 underneath) at 1 and 2 threads to find PyTorch's best setting, then
runs rounds of PyTorch-then-`tinylm bench --cases p1,p2` in the same invocation and
prints each round's tinylm / PyTorch and the median over rounds.

  scripts/bench_pytorch.py [--tinylm build/release/tinylm] [--quick]
Output: JSON lines, one per figure, then one per ratio.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import time

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("error: PyTorch for Python is missing: apt-get install python3-torch", file=sys.stderr)
    sys.exit(1)


class Attention(nn.Module):
    def __init__(self, d, h, ctx):
        super().__init__()
        self.h, self.dh = h, d // h
        self.qkv_proj = nn.Linear(d, 3 * d)
        self.out_proj = nn.Linear(d, d)
        self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv_proj(x).chunk(3, dim=-1)
        q, k, v = (z.view(b, t, self.h, self.dh).transpose(1, 2) for z in (q, k, v))
        s = q @ k.transpose(-2, -1) / math.sqrt(self.dh)
        s = s.masked_fill(~self.mask[:t, :t], float("-inf"))
        ctx = (s.softmax(-1) @ v).transpose(1, 2).contiguous().view(b, t, d)
        return self.out_proj(ctx)


class TinyAttentionLM(nn.Module):  # P1: the reference model
    def __init__(self, vocab=64, d=32, h=4, ctx=12):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        nn.init.normal_(self.emb.weight, std=0.02)
        pos = torch.arange(ctx).unsqueeze(1) / torch.pow(10000.0, torch.arange(0, d, 2) / d)
        pe = torch.zeros(ctx, d)
        pe[:, 0::2], pe[:, 1::2] = torch.sin(pos), torch.cos(pos)
        self.register_buffer("pe", pe, persistent=False)
        self.attn = Attention(d, h, ctx)
        self.head = nn.Linear(d, vocab)

    def forward(self, ids):
        return self.head(self.attn(self.emb(ids) + self.pe[: ids.shape[1]]))


class Block(nn.Module):
    def __init__(self, d, h, ctx):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = Attention(d, h, ctx)
        self.fc, self.proj = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class TransformerLM(nn.Module):  # P2: the medium model, tied head, learned positions
    def __init__(self, vocab=256, ctx=128, d=256, h=8, layers=4):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.blocks = nn.ModuleList(Block(d, h, ctx) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)

    def forward(self, ids):
        x = self.emb(ids) + self.pos.weight[: ids.shape[1]]
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.emb.weight)


def set_threads(n):
    """LibTorch's intra-op threads and OpenBLAS's own pool, as tinylm's --threads does."""
    torch.set_num_threads(n)
    try:
        ctypes.CDLL("libblas.so.3").openblas_set_num_threads(n)
    except (OSError, AttributeError):
        pass


def time_steps(step, warmup, reps, inner):
    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(inner):
            step()
        times.append((time.perf_counter() - t0) / inner)
    times.sort()
    return times[len(times) // 2], times[0], times[-1]


def p1_step_fn():
    torch.manual_seed(42)
    model = TinyAttentionLM()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(43)

    def step():
        ids = torch.randint(64, (16, 1), generator=g).expand(16, 13)
        x, y = ids[:, :12], ids[:, 1:]
        loss = F.cross_entropy(model(x).reshape(-1, 64), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
    return step


def p2_step_fn(quick):
    torch.manual_seed(42)
    layers, seq, batch = (1, 32, 4) if quick else (4, 128, 16)
    model = TransformerLM(layers=layers, ctx=seq)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.startswith(("emb", "pos"))]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and not n.startswith(("emb", "pos")))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}], lr=1e-3)
    g = torch.Generator().manual_seed(43)

    def step():
        ids = torch.randint(256, (batch, seq + 1), generator=g)
        loss = F.cross_entropy(model(ids[:, :-1]).reshape(-1, 256), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
    return step, batch * seq


def emit(case, metric, value, unit, **extra):
    print(json.dumps({"case": case, "metric": metric, "value": round(value, 6), "unit": unit, **extra}), flush=True)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tinylm", default=os.path.join(here, "..", "build", "release", "tinylm"))
    parser.add_argument("--quick", action="store_true", help="tiny counts: checks the script, not speed")
    parser.add_argument("--tinylm-threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3, help="PyTorch-then-tinylm rounds")
    args = parser.parse_args()
    if not os.access(args.tinylm, os.X_OK):
        print(f"error: {args.tinylm} is not an executable: build first (scripts/quickstart.sh test)", file=sys.stderr)
        sys.exit(1)

    # PyTorch's best thread count, found once.
    threads_best = {}
    for case in ("p1", "p2"):
        rates = {}
        for threads in (1, 2):
            set_threads(threads)
            rates[threads] = measure_pytorch(case, args.quick)[0]
            emit(f"pytorch_{case}", "rate_at_threads", rates[threads], UNITS[case], threads=threads)
        threads_best[case] = max(rates, key=rates.get)

    # Then rounds of PyTorch-then-tinylm: each round's ratio is measured side by side, so
    # a machine whose speed drifts moves both figures of a round together.
    ratios = {"p1": [], "p2": []}
    cmd = [args.tinylm, "bench", "--cases", "p1,p2", "--threads", str(args.tinylm_threads)] + (["--quick"] if args.quick else [])
    for r in range(args.rounds):
        theirs = {}
        for case in ("p1", "p2"):
            set_threads(threads_best[case])
            theirs[case], lo, hi = measure_pytorch(case, args.quick)
            emit(f"pytorch_{case}", "rate", theirs[case], UNITS[case], min=lo, max=hi, threads=threads_best[case], round=r)
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"error: {' '.join(cmd)} failed: {out.stderr.strip()}", file=sys.stderr)
            sys.exit(1)
        ours = {}
        for line in out.stdout.splitlines():
            rec = json.loads(line)
            rec["round"] = r
            print(json.dumps(rec), flush=True)
            if rec["case"] == "p1" and rec["metric"] == "train_steps_per_s":
                ours["p1"] = rec["value"]
            if rec["case"] == "p2" and rec["metric"] == "train_tokens_per_s":
                ours["p2"] = rec["value"]
        for case in ("p1", "p2"):
            ratios[case].append(ours[case] / theirs[case])
            emit(f"{case}_ratio", "tinylm_over_pytorch", ours[case] / theirs[case], "x", round=r,
                 tinylm=ours[case], pytorch=theirs[case])
    for case in ("p1", "p2"):
        emit(f"{case}_ratio", "median_tinylm_over_pytorch", statistics.median(ratios[case]), "x",
             rounds=len(ratios[case]), all=[round(x, 3) for x in ratios[case]])


UNITS = {"p1": "steps/s", "p2": "tokens/s"}


def measure_pytorch(case, quick):
    """(median rate, min rate, max rate) of PyTorch's training loop for P1 or P2."""
    if case == "p1":
        med, lo, hi = time_steps(p1_step_fn(), 2 if quick else 50, 2 if quick else 9, 5 if quick else 100)
        return 1 / med, 1 / hi, 1 / lo
    step, tokens = p2_step_fn(quick)
    med, lo, hi = time_steps(step, 1 if quick else 3, 2 if quick else 5, 1 if quick else 3)
    return tokens / med, tokens / hi, tokens / lo


if __name__ == "__main__":
    main()
