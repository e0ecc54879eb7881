#!/usr/bin/python3
"""Pictures of a tinylm run, as PNG files (matplotlib: apt-get install python3-matplotlib).

  scripts/plot.py loss runs/copy/metrics.jsonl -o loss.png
  scripts/plot.py attention runs/default/best.ckpt --prompt "5 5 5 5" -o attention.png
  scripts/plot.py attention weights.json -o attention.png   # from tinylm sample --attention-json
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def load_matplotlib():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        return plt
    except ImportError:
        fail("matplotlib is not installed: apt-get install python3-matplotlib")


def plot_loss(args):
    train, evals, scored = [], [], []
    try:
        with open(args.metrics) as f:
            for n, line in enumerate(f, 1):
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError:
                    fail(f"{args.metrics}:{n}: not a JSON line")
                if rec.get("type") == "train" and rec.get("mean_loss") is not None:
                    train.append((rec["step"], rec["mean_loss"]))
                elif rec.get("type") == "eval" and rec.get("loss") is not None:
                    evals.append((rec["step"], rec["loss"]))
                    if rec.get("scored_loss") is not None and abs(rec["scored_loss"] - rec["loss"]) > 1e-12:
                        scored.append((rec["step"], rec["scored_loss"]))
    except OSError as e:
        fail(f"cannot read {args.metrics}: {e.strerror}")
    if not train:
        fail(f"{args.metrics} has no training records")
    plt = load_matplotlib()
    fig, ax = plt.subplots(figsize=(7, 4), dpi=120)
    ax.plot(*zip(*train), label="train (mean since last log line)")
    if evals:
        ax.plot(*zip(*evals), "o-", label="validation")
    if scored:
        ax.plot(*zip(*scored), "s--", label="validation, predictable positions")
    values = [v for _, v in train + evals + scored if v > 0]
    if values and max(values) / min(values) > 20:
        ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats)")
    ax.set_title(args.title or os.path.dirname(os.path.abspath(args.metrics)))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(args.output)
    print(f"wrote {args.output}")


def plot_attention(args):
    source = args.source
    if source.endswith(".json"):
        path = source
    else:
        if not args.prompt:
            fail("attention from a checkpoint needs --prompt")
        path = os.path.join(tempfile.mkdtemp(), "attention.json")
        cmd = [args.tinylm, "--log-level", "warn", "sample", source, "--prompt", args.prompt, "--greedy",
               "--max-new-tokens", str(args.max_new_tokens), "--layer", str(args.layer),
               "--head", str(args.head), "--attention-json", path]
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            fail(result.stderr.strip() or f"{args.tinylm} failed")
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        fail(f"cannot read attention weights from {path}: {e}")
    plt = load_matplotlib()
    weights, tokens = data["weights"], [str(t) for t in data["tokens"]]
    fig, ax = plt.subplots(figsize=(6, 5), dpi=120)
    im = ax.imshow(weights, cmap="viridis", vmin=0.0)
    ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=7)
    ax.set_yticks(range(len(tokens)), tokens, fontsize=7)
    ax.set_xlabel("key")
    ax.set_ylabel("query")
    ax.set_title(args.title or f"attention, layer {data['layer']} head {data['head']}")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(args.output)
    print(f"wrote {args.output}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="what", required=True)
    loss = sub.add_parser("loss", help="loss curve from a metrics.jsonl file")
    loss.add_argument("metrics")
    loss.add_argument("-o", "--output", default="loss.png")
    loss.add_argument("--title")
    att = sub.add_parser("attention", help="attention heatmap from a checkpoint or a JSON file")
    att.add_argument("source", help="checkpoint, run directory, or JSON from tinylm sample --attention-json")
    att.add_argument("--prompt")
    att.add_argument("--max-new-tokens", type=int, default=0)
    att.add_argument("--layer", type=int, default=-1)
    att.add_argument("--head", type=int, default=0)
    att.add_argument("--tinylm", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build", "release", "tinylm"))
    att.add_argument("-o", "--output", default="attention.png")
    att.add_argument("--title")
    args = parser.parse_args()
    plot_loss(args) if args.what == "loss" else plot_attention(args)


if __name__ == "__main__":
    main()
