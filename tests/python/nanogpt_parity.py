#!/usr/bin/env python3
"""tinylm <-> nanoGPT: the same weights give the same logits in both.

The model below is written here in nanoGPT's structure and parameter names (model.py of
karpathy/nanoGPT: pre-LN blocks, learned positions, exact GELU, tied head); only the
causal mask is a non-persistent buffer, as it is when nanoGPT uses flash attention.
usage (several pairs or files in one call: one start of Python and PyTorch for them all):
  nanogpt_parity.py compare CKPT.pt LOGITS.pt [CKPT.pt LOGITS.pt ...]   load each CKPT (a
      tinylm export, or a file `make` wrote) into GPT with strict=True; compare its logits
      for LOGITS' ids ({"ids", "logits"}, written by tinylm) within 1e-5
  nanogpt_parity.py make OUT.pt[:FLAG,...] [OUT.pt[:FLAG,...] ...]   FLAG: bare, no-prefix,
      no-bias. Each a GPT with random weights, after one AdamW step, saved as nanoGPT's
      train.py saves it: {"model": state_dict() (an OrderedDict; keys with torch.compile's
      "_orig_mod." prefix unless no-prefix), "optimizer", "model_args", "iter_num",
      "best_val_loss", "config"}, and the model alone (OUT-model.pt); or as a bare state
      dict (a dict, and the OrderedDict state_dict() returns in OUT-ordered.pt). no-bias:
      bias=False.
"""
import math
import sys

import torch
import torch.nn as nn
from torch.nn import functional as F


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"], bias=c["bias"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"], bias=c["bias"])
        self.n_head, self.n_embd = c["n_head"], c["n_embd"]
        n = c["block_size"]
        self.register_buffer("mask", torch.tril(torch.ones(n, n)).view(1, 1, n, n), persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"], bias=c["bias"])
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"], bias=c["bias"])

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c["n_embd"], bias=c["bias"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c["n_embd"], bias=c["bias"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]),
            wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            drop=nn.Dropout(c["dropout"]),
            h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
            ln_f=LayerNorm(c["n_embd"], bias=c["bias"]),
        ))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def load_compare(path):
    ck = torch.load(path)
    state = {k[len("_orig_mod."):] if k.startswith("_orig_mod.") else k: v for k, v in ck["model"].items()}
    return ck["model_args"], state


def compare(ckpt, logits_file):
    args, state = load_compare(ckpt)
    reference = torch.load(logits_file)
    model = GPT(args)
    model.load_state_dict(state, strict=True)  # raises on a missing or extra key
    model.eval()
    with torch.no_grad():
        logits = model(reference["ids"])
    worst = (logits - reference["logits"]).abs().max().item()
    ok = logits.shape == reference["logits"].shape and worst <= 1e-5
    print(("ok  " if ok else "FAIL") + f" nanoGPT's GPT loaded {ckpt} (strict=True, "
          f"{sum(p.numel() for p in model.parameters())} parameters); logits {tuple(logits.shape)}, "
          f"largest difference from tinylm's {worst:.3g} (tolerance 1e-5)")
    return ok


def make(out, bare, prefix=True, bias=True):
    torch.manual_seed(7)
    args = dict(n_layer=2, n_head=4, n_embd=32, block_size=16, bias=bias, vocab_size=50, dropout=0.0)
    model = GPT(args)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)  # far from any default, so a missed weight shows in the logits
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    optimizer.step()
    if bare:
        torch.save(dict(model.state_dict()), out)
        torch.save(model.state_dict(), out.replace(".pt", "-ordered.pt"))  # an OrderedDict
        return True
    state = model.state_dict()  # an OrderedDict, with its _metadata, as train.py saves it
    if prefix:  # what train.py saves after torch.compile (raw_model is the compiled module)
        state = type(state)(("_orig_mod." + k, v) for k, v in state.items())
    config = {"out_dir": "out-shakespeare-char", "eval_interval": 250, "dataset": "shakespeare_char",
              "compile": prefix, "learning_rate": 1e-3, "betas": None, "decay_lr": True, "dtype": "float32",
              "wandb_run_name": "mini-gpt", "init_from": "scratch"}
    torch.save({"model": state, "optimizer": optimizer.state_dict(), "model_args": args,
                "iter_num": 250, "best_val_loss": torch.tensor(1.25), "config": config}, out)
    torch.save({"model": state, "model_args": args, "iter_num": 250}, out.replace(".pt", "-model.pt"))
    return True


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    ok = True
    if mode == "compare":
        if not args or len(args) % 2:
            sys.exit("usage: nanogpt_parity.py compare CKPT.pt LOGITS.pt [CKPT.pt LOGITS.pt ...]")
        for ckpt, logits in zip(args[0::2], args[1::2]):
            ok = compare(ckpt, logits) and ok
    elif mode == "make" and args:
        for spec in args:
            out, _, flags = spec.partition(":")
            flags = set(flags.split(",")) - {""}
            if flags - {"bare", "no-prefix", "no-bias"}:
                sys.exit(f"unknown flag(s) {sorted(flags)} in {spec}: bare, no-prefix, no-bias")
            ok = make(out, "bare" in flags, "no-prefix" not in flags, "no-bias" not in flags) and ok
    else:
        sys.exit("usage: nanogpt_parity.py compare|make ... (see the top of this file)")
    sys.exit(0 if ok else 1)
