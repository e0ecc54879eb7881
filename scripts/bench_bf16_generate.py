#!/usr/bin/python3
"""Generation with bfloat16 products against float32 (issue 40): `tinylm sample --greedy
--time` on each checkpoint, float32 and --bf16 in turn for --rounds rounds, the tokens/s of
each (their medians), the ratio, and whether the greedy text is the same (where not, the
first token that differs and the two texts from there).

  scripts/bench_bf16_generate.py --tinylm build/release/tinylm --prompt "3 3 3 7" \\
      --max-new-tokens 200 [--device cpu|cuda] CHECKPOINT...
Output: JSON lines, one per checkpoint and precision, then one per checkpoint with the ratio."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys


def sample(tinylm, checkpoint, prompt, tokens, bf16, device):
    cmd = [tinylm, "sample", checkpoint, "--prompt", prompt, "--greedy", "--max-new-tokens", str(tokens),
           "--time", "--raw", "--device", device] + (["--bf16"] if bf16 else [])
    out = subprocess.run(cmd, capture_output=True)
    if out.returncode != 0:
        print(f"error: {' '.join(cmd)} failed: {out.stderr.decode(errors='replace').strip()}", file=sys.stderr)
        sys.exit(1)
    m = re.search(r"generated (\d+) tokens in [0-9.]+ s: ([0-9.]+) tokens/s", out.stderr.decode())
    if not m:
        print(f"error: {' '.join(cmd)} printed no --time line", file=sys.stderr)
        sys.exit(1)
    return float(m.group(2)), out.stdout


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--tinylm", default=os.path.join(here, "..", "build", "release", "tinylm"))
    parser.add_argument("--prompt", default="3 3 3 7")
    parser.add_argument("--max-new-tokens", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: where both precisions run")
    args = parser.parse_args()
    if args.rounds < 1 or args.max_new_tokens < 1:
        print("error: --rounds and --max-new-tokens must be >= 1", file=sys.stderr)
        sys.exit(1)
    for checkpoint in args.checkpoints:
        rates = {False: [], True: []}
        texts = {}
        for _ in range(args.rounds):
            for bf16 in (False, True):
                rate, text = sample(args.tinylm, checkpoint, args.prompt, args.max_new_tokens, bf16, args.device)
                rates[bf16].append(rate)
                if texts.setdefault(bf16, text) != text:
                    print(f"error: {checkpoint}: greedy text changed between rounds (bf16 {bf16})", file=sys.stderr)
                    sys.exit(1)
        name = os.path.basename(checkpoint)
        for bf16 in (False, True):
            print(json.dumps({"case": "generate_bf16" if bf16 else "generate_float32", "checkpoint": name,
                              "path": checkpoint, "device": args.device,
                              "metric": "tokens_per_s", "value": round(statistics.median(rates[bf16]), 1),
                              "unit": "tokens/s", "all": [round(r, 1) for r in rates[bf16]]}), flush=True)
        same = texts[False] == texts[True]
        record = {"case": "generate_bf16", "checkpoint": name, "path": checkpoint, "device": args.device,
                  "metric": "over_float32",
                  "value": round(statistics.median(b / f for f, b in zip(rates[False], rates[True])), 3), "unit": "x",
                  "tokens": args.max_new_tokens, "prompt": args.prompt, "same_greedy_text": same}
        if not same:
            a, b = texts[False], texts[True]
            first = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
            record.update({"first_difference_byte": first, "float32_from_there": a[first:first + 40].decode(errors="replace"),
                           "bf16_from_there": b[first:first + 40].decode(errors="replace")})
        print(json.dumps(record), flush=True)


if __name__ == "__main__":
    main()
