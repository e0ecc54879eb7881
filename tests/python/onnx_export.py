#!/usr/bin/env python3
"""tinylm's ONNX export against tinylm's own logits: every NAME.onnx in DIR (written with
NAME.pt, the ids and logits tinylm gave, by tinylm's "[onnx-export]" test) must pass ONNX's
full checker, and its graph, evaluated here node by node with PyTorch from ONNX's operator
definitions (opset 17), must give tinylm's logits to float32 rounding. Where ONNX Runtime
is installed (Debian 13 packages it; Debian 12 does not), its logits must match too; on
Debian 13 its absence is a failure, not a skip.

usage: onnx_export.py DIR
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


def main():
    folder = pathlib.Path(sys.argv[1])
    try:
        import onnxruntime
    except ImportError:
        onnxruntime = None
        if debian_major() >= 13:
            sys.exit("FAIL: python3-onnxruntime is not installed, and Debian 13 has it (scripts/setup.sh installs it)")
        print("ONNX Runtime: not packaged on this Debian; the graphs are evaluated by the reference evaluator alone")
    files = sorted(folder.glob("*.onnx"))
    if not files:
        sys.exit("FAIL: no .onnx files in %s" % folder)
    worst = 0.0
    for path in files:
        model = onnx.load(str(path))
        onnx.checker.check_model(model, full_check=True)
        ref = torch.load(str(path.with_suffix(".pt")))
        if model.opset_import[0].version != 17:
            sys.exit("FAIL: %s: opset %d, expected 17" % (path.name, model.opset_import[0].version))
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]) if onnxruntime else None
        for key in sorted(k for k in ref if k.startswith("ids.")):
            ids, expected = ref[key].numpy(), ref["logits." + key[4:]].numpy()
            results = {"evaluator": run_graph(model, {"input_ids": ids})[0]}
            if session:
                results["onnxruntime"] = session.run(["logits"], {"input_ids": ids})[0]
            scale = max(1.0, float(np.abs(expected).max()))
            for who, got in results.items():
                if got.shape != expected.shape:
                    sys.exit("FAIL: %s, %s: %s gives logits of shape %s, tinylm %s"
                             % (path.name, key, who, got.shape, expected.shape))
                diff = float(np.abs(got - expected).max()) / scale
                worst = max(worst, diff)
                print("%-34s T=%-3s %-12s largest difference %.2e (relative to the largest logit)"
                      % (path.stem, key[4:], who, diff))
                if not diff <= 1e-5:
                    sys.exit("FAIL: %s, %s: %s differs from tinylm by %.2e (allowed 1e-5)" % (path.name, key, who, diff))
    print("ok: %d models pass the ONNX checker and give tinylm's logits (largest relative difference %.1e)%s"
          % (len(files), worst, " in ONNX Runtime %s too" % onnxruntime.__version__ if onnxruntime else ""))


main()
