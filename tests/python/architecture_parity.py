#!/usr/bin/env python3
"""tinylm's transformer with rotary positions, RMSNorm, SwiGLU and grouped-query attention
against the same model written here in plain PyTorch, from the formulas these
architectures are published with (RoPE in GPT-NeoX's and Hugging Face LLaMA's
rotate-half layout; RMSNorm as LLaMA's; SwiGLU as LLaMA's MLP; keys and values repeated
for their query heads as Hugging Face's repeat_kv), none of it taken from tinylm's code.

usage: architecture_parity.py DIR
  DIR holds NAME.pt (ids, targets, logits, loss, param.* and grad.* for every parameter,
  written by tinylm's "[architecture-parity]" test) and NAME.json (the architecture's
  options). For each, the weights are loaded into the model below; its logits, loss and
  every gradient must match tinylm's to float32 rounding. Prints the largest differences.
"""
import json
import math
import pathlib
import sys

import torch
from torch.nn import functional as F


def norm(x, p, name, o):
    w, b = p.get(name + ".weight"), p.get(name + ".bias")
    if o["norm"] == "rms-norm":
        y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
        if w is not None:
            y = y * w
        return y + b if b is not None else y
    return F.layer_norm(x, (x.size(-1),), w, b, 1e-5)


def rotate(x, base):
    """x (B, H, T, Dh): each head's halves rotated by position * base^(-2i/Dh)."""
    T, Dh = x.size(2), x.size(3)
    inv_freq = base ** (-(torch.arange(Dh // 2, dtype=torch.float64) * 2 / Dh))
    angles = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], -1).float()
    sin = torch.cat([angles.sin(), angles.sin()], -1).float()
    x1, x2 = x[..., : Dh // 2], x[..., Dh // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(x, p, pre, o):
    B, T, D = x.shape
    H = int(o["n_heads"])
    Hkv = int(o["n_kv_heads"]) or H
    Dh = D // H
    qkv = F.linear(x, p[pre + "qkv_proj.weight"], p.get(pre + "qkv_proj.bias"))
    q, k, v = qkv.split([D, Hkv * Dh, Hkv * Dh], dim=-1)
    q = q.view(B, T, H, Dh).transpose(1, 2)
    k = k.view(B, T, Hkv, Dh).transpose(1, 2)
    v = v.view(B, T, Hkv, Dh).transpose(1, 2)
    if o["positions"] == "rotary":
        q, k = rotate(q, float(o["pos_base"])), rotate(k, float(o["pos_base"]))
    k = k.repeat_interleave(H // Hkv, dim=1)  # repeat_kv: query head j reads kv head j // (H / Hkv)
    v = v.repeat_interleave(H // Hkv, dim=1)
    att = (q @ k.transpose(-2, -1)) / math.sqrt(Dh)
    att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).tril().logical_not(), float("-inf"))
    y = (att.softmax(-1) @ v).transpose(1, 2).reshape(B, T, D)
    return F.linear(y, p[pre + "out_proj.weight"], p.get(pre + "out_proj.bias"))


def mlp(x, p, pre, o):
    h = F.linear(x, p[pre + "fc.weight"], p.get(pre + "fc.bias"))
    if o["activation"] == "swiglu":
        gate, up = h.chunk(2, dim=-1)
        h = F.silu(gate) * up
    else:
        h = F.gelu(h, approximate="tanh") if o["activation"] == "gelu-tanh" else F.gelu(h)
    return F.linear(h, p[pre + "proj.weight"], p.get(pre + "proj.bias"))


def logits_of(ids, p, o):
    T = ids.size(1)
    x = p["token_embedding.weight"][ids]
    if o["positions"] == "learned":
        x = x + p["learned_positions.weight"][:T]
    assert o["positions"] in ("learned", "rotary", "none")
    assert o["pre_ln"] == "true"
    for layer in range(int(o["n_layers"])):
        pre = "blocks.%d." % layer
        x = x + attention(norm(x, p, pre + "ln1", o), p, pre + "attn.", o)
        x = x + mlp(norm(x, p, pre + "ln2", o), p, pre + "mlp.", o)
    head = p["token_embedding.weight"] if o["tie_weights"] == "true" else p["lm_head.weight"]
    return norm(x, p, "ln_f", o) @ head.t()


def compare(stem):
    o = json.loads(stem.with_suffix(".json").read_text())
    saved = torch.load(str(stem.with_suffix(".pt")), weights_only=True) if "weights_only" in torch.load.__code__.co_varnames else torch.load(str(stem.with_suffix(".pt")))
    p = {k[len("param."):]: v.clone().requires_grad_() for k, v in saved.items() if k.startswith("param.")}
    logits = logits_of(saved["ids"], p, o)
    loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), saved["targets"].reshape(-1))
    loss.backward()
    worst = {"logits": (logits.detach() - saved["logits"]).abs().max().item(),
             "loss": abs(loss.item() - saved["loss"].item())}
    grad_scale = max(saved["grad." + n].abs().max().item() for n in p)
    worst["grad"] = max((p[n].grad - saved["grad." + n]).abs().max().item() for n in p) / grad_scale
    missing = [n for n in p if p[n].grad is None]
    ok = worst["logits"] < 2e-5 and worst["loss"] < 2e-6 and worst["grad"] < 2e-5 and not missing
    print("%s %-28s logits %.2e  loss %.2e  gradients %.2e (of the largest, %.2e)" %
          ("ok  " if ok else "FAIL", stem.name, worst["logits"], worst["loss"], worst["grad"], grad_scale))
    return ok


def main():
    stems = sorted(pathlib.Path(sys.argv[1]).glob("*.json"))
    if not stems:
        print("FAIL: no models in", sys.argv[1])
        return 1
    results = [compare(s.with_suffix("")) for s in stems]
    print("%d of %d models match PyTorch %s" % (sum(results), len(results), torch.__version__))
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
