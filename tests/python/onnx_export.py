#!/usr/bin/env python3
"""tinylm's ONNX export against tinylm's own logits: every NAME.onnx and NAME.kv.onnx in
DIR (written with NAME.pt, the ids and logits tinylm gave and its greedy tokens, by
tinylm's "[onnx-export]" test) must pass ONNX's full checker, and its graph, evaluated here
node by node with PyTorch from ONNX's operator definitions (opset 17), must give tinylm's
logits to float32 rounding. The KV-cache graphs must give them a token at a time too, with
attention weights that are each query's distribution over what it may see, and generate
greedily the tokens tinylm's generate() gives, past the context. Where ONNX Runtime is
installed (Debian 13 packages it; Debian 12 does not), it must do all of this too; on
Debian 13 its absence is a failure, not a skip.

usage: onnx_export.py DIR
       onnx_export.py --generate MODEL.kv.onnx "PROMPT IDS" N   (greedy ids, a line per runtime)
"""
import math
import os
import pathlib
import sys

import numpy as np
import onnx
import torch
from onnx import numpy_helper


def attrs(node):
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def broadcast_expand(x, shape):
    return x.expand(torch.broadcast_shapes(x.shape, tuple(int(s) for s in shape)))


def run_graph(model, feeds):
    """Evaluates the graph's nodes in order (ONNX requires a topological order)."""
    values = {i.name: torch.from_numpy(numpy_helper.to_array(i).copy()) for i in model.graph.initializer}
    values.update({k: torch.from_numpy(v) for k, v in feeds.items()})
    for node in model.graph.node:
        a, x = attrs(node), [values[i] if i else None for i in node.input]
        op = node.op_type
        if op == "Shape":
            out = [torch.tensor(list(x[0].shape), dtype=torch.int64)]
        elif op == "Slice":
            data, starts, ends, axes = x[0], x[1].tolist(), x[2].tolist(), x[3].tolist()
            index = [slice(None)] * data.dim()
            for s, e, ax in zip(starts, ends, axes):
                n = data.shape[ax]
                index[ax] = slice(max(0, min(s if s >= 0 else s + n, n)), max(0, min(e if e >= 0 else e + n, n)))
            out = [data[tuple(index)]]
        elif op == "Gather":
            out = [torch.index_select(x[0], a.get("axis", 0), x[1].reshape(-1)).reshape(
                tuple(x[1].shape) + tuple(x[0].shape[1:]))]
        elif op in ("Add", "Sub", "Mul", "Div"):
            out = [{"Add": torch.add, "Sub": torch.sub, "Mul": torch.mul, "Div": torch.div}[op](x[0], x[1])]
        elif op == "MatMul":
            out = [torch.matmul(x[0], x[1])]
        elif op == "Transpose":
            out = [x[0].permute(*a["perm"])]
        elif op == "Split":
            out = list(torch.split(x[0], x[1].tolist(), dim=a.get("axis", 0)))
        elif op == "Reshape":
            shape = [x[0].shape[i] if s == 0 else s for i, s in enumerate(x[1].tolist())]
            out = [x[0].reshape(shape)]
        elif op == "Concat":
            out = [torch.cat(x, dim=a["axis"])]
        elif op == "Unsqueeze":
            y = x[0]
            for ax in sorted(x[1].tolist()):
                y = y.unsqueeze(ax)
            out = [y]
        elif op == "Expand":
            out = [broadcast_expand(x[0], x[1].tolist())]
        elif op == "Softmax":
            out = [torch.softmax(x[0], dim=a.get("axis", -1))]
        elif op == "LayerNormalization":
            axis = a.get("axis", -1)
            shape = x[0].shape[axis:] if axis != -1 else x[0].shape[-1:]
            out = [torch.nn.functional.layer_norm(x[0], shape, x[1], x[2] if len(x) > 2 else None,
                                                  a.get("epsilon", 1e-5))]
        elif op == "ReduceMean":
            out = [x[0].mean(dim=a["axes"], keepdim=bool(a.get("keepdims", 1)))]
        elif op in ("Sqrt", "Sigmoid", "Erf", "Tanh", "Identity"):
            out = [{"Sqrt": torch.sqrt, "Sigmoid": torch.sigmoid, "Erf": torch.erf, "Tanh": torch.tanh,
                    "Identity": lambda t: t}[op](x[0])]
        else:
            raise SystemExit("FAIL: the graph uses %s, which this evaluator does not know" % op)
        for name, value in zip(node.output, out):
            values[name] = value
    return [values[o.name].numpy() for o in model.graph.output]


def debian_major():
    try:
        return int(open("/etc/debian_version").read().split(".")[0])
    except (OSError, ValueError):
        return 0


class Runner:
    """One graph, run by the reference evaluator and by ONNX Runtime where it is installed."""

    def __init__(self, path, onnxruntime):
        self.model = onnx.load(str(path))
        onnx.checker.check_model(self.model, full_check=True)
        if self.model.opset_import[0].version != 17:
            sys.exit("FAIL: %s: opset %d, expected 17" % (path.name, self.model.opset_import[0].version))
        self.outputs = [o.name for o in self.model.graph.output]
        self.session = (onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
                        if onnxruntime else None)
        self.past = [(i.name, [d.dim_value for d in i.type.tensor_type.shape.dim])
                     for i in self.model.graph.input if i.name.startswith("past_key_values.")]

    def who(self):
        return ["evaluator"] + (["onnxruntime"] if self.session else [])

    def run(self, who, feeds):
        if who == "evaluator":
            out = run_graph(self.model, feeds)
        else:
            out = self.session.run(self.outputs, feeds)
        return dict(zip(self.outputs, out))

    def empty_past(self, batch):
        """past_sequence 0: (batch, kv_heads, 0, d_head) for each cache input."""
        return {name: np.zeros((batch, dims[1], 0, dims[3]), dtype=np.float32) for name, dims in self.past}


def check(path, key, who, got, expected, worst):
    if got.shape != expected.shape:
        sys.exit("FAIL: %s, %s: %s gives logits of shape %s, tinylm %s" % (path.name, key, who, got.shape, expected.shape))
    diff = float(np.abs(got - expected).max()) / max(1.0, float(np.abs(expected).max()))
    print("%-37s %-14s %-12s largest difference %.2e (relative to the largest logit)" % (path.stem, key, who, diff))
    if not diff <= 1e-5:
        sys.exit("FAIL: %s, %s: %s differs from tinylm by %.2e (allowed 1e-5)" % (path.name, key, who, diff))
    return max(worst, diff)


def step(runner, who, ids, past):
    """One call of the KV-cache graph: the logits, the next past, and the attentions, which
    must be distributions over the positions each query may see (none past its own)."""
    feeds = {"input_ids": ids}
    feeds.update(past)
    out = runner.run(who, feeds)
    P, T = next(iter(past.values())).shape[2], ids.shape[1]
    for name in (n for n in out if n.startswith("attentions.")):
        a = out[name]
        if a.shape[2:] != (T, P + T) or not np.allclose(a.sum(-1), 1, atol=1e-5):
            sys.exit("FAIL: %s of shape %s (T=%d after %d): not each query's distribution" % (name, a.shape, T, P))
        if T > 1 and np.abs(np.triu(a, k=P + 1)).max() > 0:
            sys.exit("FAIL: %s: a query attends to a later position" % name)
    following = {n.replace("past_key_values.", "present."): n for n in past}
    return out["logits"], {following[n]: v for n, v in out.items() if n in following}


def generate_greedy(runner, who, prompt, n):
    """prompt (B, T) and n tokens, each the most likely, as generate() decodes: on the cache
    while it holds fewer than the context's positions, then the last C tokens read afresh."""
    context = int(dict((p.key, p.value) for p in runner.model.metadata_props)["tinylm.context_length"])
    seq = prompt[:, -context:]
    logits, past = step(runner, who, seq, runner.empty_past(prompt.shape[0]))
    seq = prompt
    for i in range(n):
        seq = np.concatenate([seq, logits[:, -1].argmax(-1)[:, None]], axis=1)
        if i == n - 1:
            break
        if next(iter(past.values())).shape[2] < context:
            logits, past = step(runner, who, seq[:, -1:], past)
        else:
            logits, past = step(runner, who, seq[:, -context:], runner.empty_past(seq.shape[0]))
    return seq


def check_kv_cache(path, runner, ref, worst):
    """The KV-cache graph: logits with an empty past, then a token at a time, equal tinylm's;
    greedy generation through the cache gives generate()'s tokens."""
    for key in sorted(k for k in ref if k.startswith("ids.")):
        ids, expected = ref[key].numpy(), ref["logits." + key[4:]].numpy()
        B, T = ids.shape
        for who in runner.who():
            whole, _ = step(runner, who, ids, runner.empty_past(B))
            worst = check(path, key + " whole", who, whole, expected, worst)
            split = T // 2  # a prefix at once, then one token at a time on its cache
            logits, past = step(runner, who, ids[:, :split], runner.empty_past(B))
            parts = [logits]
            for t in range(split, T):
                logits, past = step(runner, who, ids[:, t:t + 1], past)
                parts.append(logits)
            worst = check(path, key + " stepped", who, np.concatenate(parts, axis=1), expected, worst)
    prompt, expected = ref["greedy.prompt"].numpy(), ref["greedy.tokens"].numpy()
    for who in runner.who():
        seq = generate_greedy(runner, who, prompt, expected.shape[1] - prompt.shape[1])
        if not np.array_equal(seq, expected):
            sys.exit("FAIL: %s: greedy generation in %s gives %s, tinylm %s" % (path.name, who, seq.tolist(),
                                                                                   expected.tolist()))
        print("%-37s %-14s %-12s greedy: %d tokens as tinylm's" % (path.stem, "generate", who,
                                                                    expected.shape[1] - prompt.shape[1]))
    return worst


def load_onnxruntime(quiet=False):
    try:
        import onnxruntime
        return onnxruntime
    except ImportError:
        if debian_major() >= 13:
            sys.exit("FAIL: python3-onnxruntime is not installed, and Debian 13 has it (scripts/setup.sh installs it)")
        if not quiet:
            print("ONNX Runtime: not packaged on this Debian; the graphs are evaluated by the reference evaluator alone")
        return None


def generate_command(args):
    """--generate MODEL.onnx PROMPT_IDS N: a line per runtime, `who: ids`, the prompt's ids
    and N more, greedily (for `tinylm sample --greedy` to compare with)."""
    path, prompt, n = pathlib.Path(args[0]), [int(t) for t in args[1].split()], int(args[2])
    runner = Runner(path, load_onnxruntime(quiet=True))
    if not runner.past:
        sys.exit("FAIL: %s has no past_key_values inputs (export it with --kv-cache)" % path.name)
    for who in runner.who():
        seq = generate_greedy(runner, who, np.array([prompt], dtype=np.int64), n)
        print("%s: %s" % (who, " ".join(str(t) for t in seq[0].tolist())))


def main():
    if sys.argv[1] == "--generate":
        return generate_command(sys.argv[2:])
    folder = pathlib.Path(sys.argv[1])
    onnxruntime = load_onnxruntime()
    files = sorted(folder.glob("*.onnx"))
    if not files:
        sys.exit("FAIL: no .onnx files in %s" % folder)
    worst = 0.0
    cached = 0
    for path in files:
        runner = Runner(path, onnxruntime)
        kv = path.name.endswith(".kv.onnx")
        ref = torch.load(str(folder / (path.name[:-len(".kv.onnx" if kv else ".onnx")] + ".pt")))
        if kv:
            if not runner.past:
                sys.exit("FAIL: %s has no past_key_values inputs" % path.name)
            worst = check_kv_cache(path, runner, ref, worst)
            cached += 1
            continue
        for key in sorted(k for k in ref if k.startswith("ids.")):
            ids, expected = ref[key].numpy(), ref["logits." + key[4:]].numpy()
            for who in runner.who():
                worst = check(path, key, who, runner.run(who, {"input_ids": ids})["logits"], expected, worst)
    if not cached:
        sys.exit("FAIL: no KV-cache graphs (*.kv.onnx) in %s" % folder)
    print("ok: %d graphs (%d with the KV cache) pass the ONNX checker and give tinylm's logits (largest relative "
          "difference %.1e) and its greedy tokens%s"
          % (len(files), cached, worst, " in ONNX Runtime %s too" % onnxruntime.__version__ if onnxruntime else ""))


main()
