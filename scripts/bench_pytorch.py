#!/usr/bin/python3
"""P1, P2 and nanoGPT's CPU recipe of `tinylm bench`, written in PyTorch from Python, and
the ratios; and the recipe's loss curve in both, from the same weights on the same batches.

Runs the same training loops as tinylm's P1 (the reference run: TinyAttentionLM,
vocab 64, d 32, 4 heads, seq 12, batch 16, Adam) and P2 (4 pre-LN blocks, d 256,
8 heads, seq 128, batch 16, vocab 256, AdamW) with Debian's python3-torch (the same
LibTorch 1.13 underneath) at 1 and 2 threads to find PyTorch's best setting, then
runs rounds of PyTorch-then-`tinylm bench --cases p1,p2` (at 1 and at 2 threads: each
side at its best) in the same invocation and prints each round's tinylm / PyTorch and
the median over rounds.

nanoGPT's CPU recipe (its README's command for a machine without a GPU): 4 layers, 4
heads, width 128, block 64, batch 12, no biases, exact GELU, learned positions, tied
head, AdamW (lr 1e-3, betas 0.9/0.99, decay 0.1 on every 2-D parameter, as nanoGPT's
configure_optimizers), clip 1.0, written as nanoGPT's model.py, on byte-level text (the
GPL); speed as ms per iteration, each side at its best thread count.

--curve STEPS trains the recipe STEPS steps in both from the same weights (made here,
imported into tinylm with `tinylm import`) on the same batches (tinylm's text task's
windows, drawn here from the same generator), warmup 100 then cosine as tinylm's
schedule, and prints each step's two losses. Two checks (exit 1 if either fails): over
the first 50 steps each step's losses agree within 1e-4 nats (the arithmetic: float32
rounding), and over all steps the means of every 20 steps agree within
--curve-tolerance (0.01 nats). Past about 50 steps training amplifies rounding
differences, so single steps drift apart by up to ~0.02 nats while the curves stay
together. Both sides are nanoGPT exactly: tinylm imports bias=False as a model without
LayerNorm biases (layer_norm_bias false) and trains with --decay-params matrices (AdamW
decays every 2-D parameter, embeddings too), as `tinylm bench --cases nanogpt` does.

--bf16 adds tinylm with bfloat16 products and PyTorch under CPU autocast to bfloat16, the
ratios against tinylm float32 and against PyTorch at its best (the faster of its float32
and autocast), and the ceiling (<case>_bf16_ceiling): PyTorch-at-its-best's model FLOP/s
(the model's FLOPs per token or iteration from tinylm's bench, at PyTorch's rate) as a
fraction of the bfloat16 matmul peak tinylm's bench measured, and its inverse, the most any
program could lead PyTorch by on this machine; and the most tinylm could lead by on its own
bfloat16 product kernels (most_lead_on_tinylm_products: PyTorch's time over that of the
step's linear products alone, the bench's products_ms), were everything else free.

  scripts/bench_pytorch.py [--tinylm build/release/tinylm] [--quick] [--cases p1,p2,nanogpt]
                           [--curve 300]
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


class LayerNorm(nn.Module):
    """nanoGPT's LayerNorm with bias=False: a gain only."""

    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, None, 1e-5)


class GPTBlock(nn.Module):
    def __init__(self, d, h, ctx):
        super().__init__()
        self.ln_1, self.ln_2 = LayerNorm(d), LayerNorm(d)
        self.c_attn, self.c_proj = nn.Linear(d, 3 * d, bias=False), nn.Linear(d, d, bias=False)
        self.c_fc, self.mlp_proj = nn.Linear(d, 4 * d, bias=False), nn.Linear(4 * d, d, bias=False)
        self.h = h
        self.register_buffer("mask", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool)), persistent=False)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.h, d // self.h).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        y = (F.softmax(att, dim=-1) @ v).transpose(1, 2).contiguous().view(b, t, d)
        x = x + self.c_proj(y)
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


class GPT(nn.Module):
    """nanoGPT's GPT with bias=False: learned positions, pre-LN, exact GELU, tied head and
    its initialisation (normal 0.02, residual projections 0.02 / sqrt(2 n_layer))."""

    def __init__(self, vocab=256, ctx=64, d=128, h=4, layers=4):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(ctx, d)
        self.h = nn.ModuleList(GPTBlock(d, h, ctx) for _ in range(layers))
        self.ln_f = LayerNorm(d)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("c_proj.weight", "mlp_proj.weight")) else 0.02
                nn.init.normal_(p, mean=0.0, std=std)

    def forward(self, ids):
        x = self.wte(ids) + self.wpe.weight[: ids.shape[1]]
        for b in self.h:
            x = b(x)
        return F.linear(self.ln_f(x), self.wte.weight)

    def nanogpt_state_dict(self):
        """The weights under nanoGPT's names (what `tinylm import` reads)."""
        out = {"transformer.wte.weight": self.wte.weight, "transformer.wpe.weight": self.wpe.weight,
               "transformer.ln_f.weight": self.ln_f.weight, "lm_head.weight": self.wte.weight}
        for i, b in enumerate(self.h):
            p = f"transformer.h.{i}."
            out.update({p + "ln_1.weight": b.ln_1.weight, p + "attn.c_attn.weight": b.c_attn.weight,
                        p + "attn.c_proj.weight": b.c_proj.weight, p + "ln_2.weight": b.ln_2.weight,
                        p + "mlp.c_fc.weight": b.c_fc.weight, p + "mlp.c_proj.weight": b.mlp_proj.weight})
        return {k: v.detach().clone() for k, v in out.items()}


def gpt_optimizer(model, lr):
    """nanoGPT's configure_optimizers: AdamW, decay 0.1 on every 2-D parameter."""
    params = list(model.parameters())
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.99))


GPL = "/usr/share/common-licenses/GPL-3"


class TextWindows:
    """tinylm's text task (src/data/tasks.cpp): the file's bytes, the last 10% held out;
    a batch is B windows of T + 1 bytes at offsets drawn by randint from `generator`."""

    def __init__(self, path, seq, generator):
        data = torch.frombuffer(bytearray(open(path, "rb").read()), dtype=torch.uint8)
        n_val = int(data.numel() * 0.1)
        self.train, self.seq, self.g = data[: data.numel() - n_val], seq, generator

    def batch(self, b):
        starts = torch.randint(self.train.numel() - self.seq, (b, 1), generator=self.g)
        rows = self.train[starts + torch.arange(self.seq + 1).unsqueeze(0)].long()
        return rows[:, :-1], rows[:, 1:]


def lr_at(step, lr, warmup, total, floor_ratio=0.1):
    """tinylm's learning_rate_at: linear warmup, then cosine to floor_ratio * lr."""
    if step < warmup:
        return lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    floor = lr * floor_ratio
    return floor + 0.5 * (lr - floor) * (1 + math.cos(math.pi * progress))


def gpt_train_step(model, opt, windows, batch=12, bf16=False):
    """One iteration of nanoGPT's train.py loop at log_interval 1 (batch 12, clip 1.0);
    returns the loss. bf16: the forward under CPU autocast to bfloat16, as train.py's
    dtype='bfloat16' does."""
    x, y = windows.batch(batch)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        logits = model(x)
    loss = F.cross_entropy(logits.float().reshape(-1, 256), y.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def nanogpt_step_fn(quick, bf16=False):
    torch.manual_seed(42)
    model = GPT()
    opt = gpt_optimizer(model, 1e-3)
    windows = TextWindows(GPL, 64, torch.Generator().manual_seed(43))
    return lambda: gpt_train_step(model, opt, windows, bf16=bf16)


def gpt2_step_fn(quick, bf16=False):
    """tinylm bench's gpt2 case: nanoGPT's recipe at GPT-2 small's shape (12 blocks, width
    768, 12 heads), sequences of 256, batches of 4; quick: 1 block, width 96, T 32, batch 2."""
    layers, d, h, seq, batch = (1, 96, 4, 32, 2) if quick else (12, 768, 12, 256, 4)
    torch.manual_seed(42)
    model = GPT(ctx=seq, d=d, h=h, layers=layers)
    opt = gpt_optimizer(model, 1e-3)
    windows = TextWindows(GPL, seq, torch.Generator().manual_seed(43))
    return (lambda: gpt_train_step(model, opt, windows, batch=batch, bf16=bf16)), batch * seq


def set_threads(n, blas=None):
    """LibTorch's intra-op threads, and OpenBLAS's own pool (n unless given)."""
    torch.set_num_threads(n)
    try:
        ctypes.CDLL("libblas.so.3").openblas_set_num_threads(blas or n)
    except (OSError, AttributeError):
        pass


# PyTorch's thread settings tried, (LibTorch intra-op, OpenBLAS): both pools at 1 or 2, and
# one pool at 2 with the other at 1 (two busy pools can spin on each other's cores).
THREAD_SETTINGS = [(1, 1), (2, 2), (2, 1), (1, 2)]


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


def p1_step_fn(bf16=False):
    torch.manual_seed(42)
    model = TinyAttentionLM()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    g = torch.Generator().manual_seed(43)

    def step():
        ids = torch.randint(64, (16, 1), generator=g).expand(16, 13)
        x, y = ids[:, :12], ids[:, 1:]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(x)
        loss = F.cross_entropy(logits.float().reshape(-1, 64), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
    return step


def p2_step_fn(quick, bf16=False):
    torch.manual_seed(42)
    layers, seq, batch = (1, 32, 4) if quick else (4, 128, 16)
    model = TransformerLM(layers=layers, ctx=seq)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.startswith(("emb", "pos"))]
    other = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and not n.startswith(("emb", "pos")))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": other, "weight_decay": 0.0}], lr=1e-3)
    g = torch.Generator().manual_seed(43)

    def step():
        ids = torch.randint(256, (batch, seq + 1), generator=g)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            logits = model(ids[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, 256), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss.item()
    return step, batch * seq


def emit(case, metric, value, unit, **extra):
    # Six decimals, and six significant digits below 1: a fraction such as the share of the
    # bfloat16 peak (0.012 on a CPU with AMX) keeps the precision its inverse is checked to.
    value = float(f"{value:.6g}") if 0 < abs(value) < 1 else round(value, 6)
    print(json.dumps({"case": case, "metric": metric, "value": value, "unit": unit, **extra}), flush=True)


def tinylm_figures(tinylm, cases, threads, quick, bf16=False):
    """One `tinylm bench` run at `threads`, its JSON lines printed; bf16: the run with --bf16
    (its cases are named <case>_bf16). Returns ({case: rate} (higher is better: nanoGPT's
    ms per iteration is turned into iterations/s), {case: the model's FLOPs per unit of the
    rate (per token, per iteration), from the bench's model_gflops}, the bfloat16 matmul
    peak in GFLOP/s or None, {case: seconds per unit of the rate the step's linear products
    alone take (bf16: the bench's products_ms)})."""
    cmd = ([tinylm, "bench", "--cases", ",".join(cases), "--threads", str(threads)] + (["--quick"] if quick else [])
           + (["--bf16"] if bf16 else []))
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        print(f"error: {' '.join(cmd)} failed: {out.stderr.strip()}", file=sys.stderr)
        sys.exit(1)
    rates, gflops, peak, products = {}, {}, None, {}
    for line in out.stdout.splitlines():
        rec = json.loads(line)
        print(json.dumps(rec), flush=True)
        case = rec["case"][:-len("_bf16")] if bf16 and rec["case"].endswith("_bf16") else rec["case"]
        key = (case, rec.get("metric"))
        if key == ("p1", "train_steps_per_s"):
            rates["p1"] = rec["value"]
        elif key in (("p2", "train_tokens_per_s"), ("gpt2", "train_tokens_per_s")):
            rates[case] = rec["value"]
        elif key == ("nanogpt", "ms_per_iter"):
            rates["nanogpt"] = 1000.0 / rec["value"]
        elif key[1] == "model_gflops" and case in UNITS:
            gflops[case] = rec["value"]
        elif key == ("peak_bf16_onednn", "matmul_gflops"):
            peak = rec["value"]
        elif key[1] == "products_ms" and case in UNITS:
            per_step = 1 if UNITS[case] == "iterations/s" else rec["config"]["batch"] * rec["config"]["seq"]
            products[case] = rec["value"] / 1e3 / per_step
    work = {case: 1e9 * gflops[case] / rates[case] for case in rates if case in gflops}
    return rates, work, peak, products


def curve(tinylm, steps, workdir, bf16=False):
    """The recipe's first `steps` losses in PyTorch (float32) and in tinylm (with bf16, in
    bfloat16), from the same weights on the same batches; returns the largest absolute
    difference over the first steps and the largest between windows' means."""
    import tempfile
    work = tempfile.mkdtemp(prefix="tinylm-curve-", dir=workdir)
    set_threads(1)
    torch.manual_seed(42)
    model = GPT()
    init = os.path.join(work, "init.pt")
    torch.save({"model": model.nanogpt_state_dict(),
                "model_args": {"n_layer": 4, "n_head": 4, "n_embd": 128, "block_size": 64, "bias": False,
                               "vocab_size": 256, "dropout": 0.0}}, init)
    ckpt = os.path.join(work, "init.ckpt")
    run = os.path.join(work, "run")
    for cmd in ([tinylm, "import", init, "--out", ckpt],
                [tinylm, "train", "--resume", ckpt, "--task", "text", "--data", GPL, "--seq-len", "64",
                 "--batch-size", "12", "--optimizer", "adamw", "--lr", "1e-3", "--beta2", "0.99",
                 "--weight-decay", "0.1", "--decay-params", "matrices", "--grad-clip", "1.0", "--lr-schedule", "cosine", "--warmup-steps", "100",
                 "--min-lr-ratio", "0.1", "--epochs", "1", "--steps-per-epoch", str(steps), "--log-every", "1",
                 "--eval-every", "0", "--seed", "42", "--threads", "1", "--out-dir", run]
                + (["--bf16"] if bf16 else [])):
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"error: {' '.join(cmd)} failed: {out.stderr.strip()}", file=sys.stderr)
            sys.exit(1)
    theirs = {}
    with open(os.path.join(run, "metrics.jsonl")) as f:
        for line in f:
            rec = json.loads(line)
            if rec.get("type") == "train":
                theirs[rec["step"]] = rec["loss"]
    opt = gpt_optimizer(model, 1e-3)
    windows = TextWindows(GPL, 64, torch.Generator().manual_seed(43))  # tinylm's data generator: seed + 1
    ours = []
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, 1e-3, 100, steps)
        ours.append(gpt_train_step(model, opt, windows))
        emit("nanogpt_curve", "loss", ours[-1], "nats", step=step + 1, tinylm=theirs[step + 1],
             difference=abs(ours[-1] - theirs[step + 1]))
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    early = max(abs(ours[i] - theirs[i + 1]) for i in range(min(steps, CURVE_STEPWISE)))
    windows_diff = max(abs(sum(ours[i:i + CURVE_WINDOW]) - sum(theirs[j + 1] for j in range(i, min(steps, i + CURVE_WINDOW))))
                       / len(ours[i:i + CURVE_WINDOW]) for i in range(0, steps, CURVE_WINDOW))
    return early, windows_diff


CURVE_STEPWISE, CURVE_WINDOW = 50, 20  # steps compared one by one; steps per compared mean


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tinylm", default=os.path.join(here, "..", "build", "release", "tinylm"))
    parser.add_argument("--quick", action="store_true", help="tiny counts: checks the script, not speed")
    parser.add_argument("--cases", default="p1,p2,nanogpt", help="comma-separated: p1, p2, nanogpt, gpt2")
    parser.add_argument("--tinylm-threads", default="1,2",
                        help="thread counts tinylm runs at; each case takes its best (default 1,2)")
    parser.add_argument("--rounds", type=int, default=3, help="PyTorch-then-tinylm rounds")
    parser.add_argument("--bf16", action="store_true",
                        help="also tinylm with bfloat16 products against tinylm float32 and PyTorch at its best "
                             "(float32 or CPU autocast to bfloat16); with --curve, tinylm's curve in bfloat16")
    parser.add_argument("--curve", type=int, default=0, metavar="STEPS",
                        help="also compare the recipe's loss curves over STEPS steps (0 = no)")
    parser.add_argument("--curve-tolerance", type=float, default=None,
                        help="largest difference between 20-step mean losses (nats; exit 1 beyond; "
                             "default 0.01, with --bf16 0.02)")
    args = parser.parse_args()
    if not os.access(args.tinylm, os.X_OK):
        print(f"error: {args.tinylm} is not an executable: build first (scripts/quickstart.sh test)", file=sys.stderr)
        sys.exit(1)
    cases = [c for c in args.cases.split(",") if c]
    unknown = set(cases) - set(UNITS)
    if unknown:
        print(f"error: unknown case(s) {sorted(unknown)}: use p1, p2, nanogpt, gpt2", file=sys.stderr)
        sys.exit(1)
    if ("nanogpt" in cases or "gpt2" in cases or args.curve) and not os.path.exists(GPL):
        print(f"error: nanogpt, gpt2 and --curve need {GPL} (Debian's base-files)", file=sys.stderr)
        sys.exit(1)
    tolerance = args.curve_tolerance if args.curve_tolerance is not None else (0.02 if args.bf16 else 0.01)
    modes = [False, True] if args.bf16 else [False]  # PyTorch: float32, CPU autocast to bfloat16

    def pytorch_name(case, bf16):
        return f"pytorch_{case}" + ("_autocast_bf16" if bf16 else "")

    # PyTorch's best thread count, found once per case and precision.
    threads_best = {}
    for case in cases if args.rounds > 0 else []:
        for bf16 in modes:
            rates = {}
            for setting in THREAD_SETTINGS[:1] if args.quick else THREAD_SETTINGS:  # --quick: the script runs
                set_threads(*setting)
                rates[setting] = measure_pytorch(case, args.quick, bf16)[0]
                emit(pytorch_name(case, bf16), "rate_at_threads", rates[setting], UNITS[case], threads=setting[0],
                     blas_threads=setting[1])
            threads_best[case, bf16] = max(rates, key=rates.get)

    # Then rounds of PyTorch-then-tinylm: each round's ratio is measured side by side, so
    # a machine whose speed drifts moves both figures of a round together.
    ratios = {}
    tinylm_threads = [int(t) for t in args.tinylm_threads.split(",")]
    for r in range(args.rounds):
        theirs = {}
        for case in cases:
            for bf16 in modes:
                set_threads(*threads_best[case, bf16])
                theirs[case, bf16], lo, hi = measure_pytorch(case, args.quick, bf16)
                emit(pytorch_name(case, bf16), "rate", theirs[case, bf16], UNITS[case], min=lo, max=hi,
                     threads=threads_best[case, bf16][0], blas_threads=threads_best[case, bf16][1], round=r)
        ours, ours_threads, work, peaks, products = {}, {}, {}, {}, {}
        for bf16 in modes:
            for threads in tinylm_threads:
                rates, flops, peaks[threads], alone = tinylm_figures(args.tinylm, cases, threads, args.quick, bf16)
                if bf16:
                    products[threads] = alone  # printed by the bfloat16 run only
                for case, rate in rates.items():
                    work[case] = flops.get(case, work.get(case))  # the same model in both precisions
                    if rate > ours.get((case, bf16), 0):
                        ours[case, bf16], ours_threads[case, bf16] = rate, threads

        def ratio(name, metric, value, unit="x", **extra):
            ratios.setdefault((name, metric, unit), []).append(value)
            emit(name, metric, value, unit, round=r, **extra)

        for case in cases:
            ratio(f"{case}_ratio", "tinylm_over_pytorch", ours[case, False] / theirs[case, False],
                  tinylm=ours[case, False], tinylm_threads=ours_threads[case, False], pytorch=theirs[case, False],
                  pytorch_threads=list(threads_best[case, False]), unit_of_rates=UNITS[case])
            if args.bf16:
                best = max(modes, key=lambda m: theirs[case, m])  # PyTorch at its best
                ratio(f"{case}_bf16_ratio", "tinylm_bf16_over_pytorch_best", ours[case, True] / theirs[case, best],
                      tinylm_bf16=ours[case, True], tinylm_threads=ours_threads[case, True],
                      pytorch=theirs[case, best], pytorch_mode="autocast bfloat16" if best else "float32",
                      pytorch_threads=list(threads_best[case, best]), unit_of_rates=UNITS[case])
                ratio(f"{case}_bf16_over_float32", "tinylm_bf16_over_tinylm_float32",
                      ours[case, True] / ours[case, False], tinylm_bf16=ours[case, True],
                      tinylm_float32=ours[case, False], unit_of_rates=UNITS[case])
                # The ceiling: PyTorch at its best as a fraction of the bfloat16 matmul peak
                # (the model's FLOPs at its rate, the peak tinylm's bench measured at tinylm's
                # thread count), and so the most any program could lead it by, were the
                # products at the peak and everything else free.
                peak = peaks.get(ours_threads[case, True])
                if work.get(case) and peak:
                    used = theirs[case, best] * work[case] / 1e9 / peak
                    ratio(f"{case}_bf16_ceiling", "pytorch_best_mfu", used, "fraction of the bfloat16 matmul peak",
                          pytorch=theirs[case, best], pytorch_mode="autocast bfloat16" if best else "float32",
                          model_gflop_per_unit=work[case] / 1e9, bf16_peak_gflops=peak,
                          peak_threads=ours_threads[case, True], unit_of_rates=UNITS[case])
                    ratio(f"{case}_bf16_ceiling", "most_possible_lead", 1.0 / used,
                          of="the bfloat16 matmul peak over PyTorch-at-its-best's model FLOP/s")
                # And the most tinylm could lead by on its own product kernels: PyTorch's
                # step time over the time the step's linear products alone take in tinylm.
                alone = products.get(ours_threads[case, True], {}).get(case)
                if alone:
                    ratio(f"{case}_bf16_ceiling", "most_lead_on_tinylm_products", 1.0 / (theirs[case, best] * alone),
                          pytorch=theirs[case, best], products_seconds_per_unit=alone,
                          threads=ours_threads[case, True], unit_of_rates=UNITS[case],
                          of="PyTorch-at-its-best's time per unit over that of tinylm's linear products alone")
    for (name, metric, unit), values in ratios.items():
        emit(name, "median_" + metric, statistics.median(values), unit, rounds=len(values),
             all=[round(x, 3) for x in values])
    if args.curve > 0:
        early, windows_diff = curve(args.tinylm, args.curve, None, args.bf16)
        # In bfloat16 the steps differ from the first (bfloat16's rounding, not float32's):
        # only the windows' means are held to a tolerance.
        emit("nanogpt_curve", "largest_step_difference_first_steps", early, "nats",
             steps=min(args.curve, CURVE_STEPWISE), tolerance=None if args.bf16 else 1e-4,
             tinylm="bfloat16 products" if args.bf16 else "float32")
        emit("nanogpt_curve", "largest_window_mean_difference", windows_diff, "nats", steps=args.curve,
             window=CURVE_WINDOW, tolerance=tolerance, tinylm="bfloat16 products" if args.bf16 else "float32")
        if (early > 1e-4 and not args.bf16) or windows_diff > tolerance:
            print(f"error: the loss curves differ: {early:.3g} nats over the first {CURVE_STEPWISE} steps "
                  f"(tolerance {'none in bfloat16' if args.bf16 else '1e-4'}), {windows_diff:.3g} between "
                  f"{CURVE_WINDOW}-step means (tolerance {tolerance})", file=sys.stderr)
            sys.exit(1)


UNITS = {"p1": "steps/s", "p2": "tokens/s", "nanogpt": "iterations/s", "gpt2": "tokens/s"}


def measure_pytorch(case, quick, bf16=False):
    """(median rate, min rate, max rate) of PyTorch's training loop for a case; bf16: its
    forward under CPU autocast to bfloat16."""
    if case == "p1":
        med, lo, hi = time_steps(p1_step_fn(bf16), 2 if quick else 50, 2 if quick else 9, 5 if quick else 100)
        return 1 / med, 1 / hi, 1 / lo
    if case == "nanogpt":
        med, lo, hi = time_steps(nanogpt_step_fn(quick, bf16), 1 if quick else 10, 2 if quick else 7, 2 if quick else 20)
        return 1 / med, 1 / hi, 1 / lo
    if case == "gpt2":
        step, tokens = gpt2_step_fn(quick, bf16)
        med, lo, hi = time_steps(step, 1, 2 if quick else 3, 1)
        return tokens / med, tokens / hi, tokens / lo
    step, tokens = p2_step_fn(quick, bf16)
    med, lo, hi = time_steps(step, 1 if quick else 3, 2 if quick else 5, 1 if quick else 3)
    return tokens / med, tokens / hi, tokens / lo


if __name__ == "__main__":
    main()
