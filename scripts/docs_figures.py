#!/usr/bin/python3
"""The figures in the documentation, written from the output of the commands that measure
them, never typed: each generated block in README.md and docs/*.md sits between

    <!-- figures: NAME -->
    ...
    <!-- /figures -->

and is rendered from files in docs/figures/ (each the saved output of one command, with the
date, the machine and the command) or, for the test count, from the build's own ctest.

  scripts/docs_figures.py write [--build-dir build/release]   rewrite every block
  scripts/docs_figures.py check [--build-dir DIR]             exit 1 where a block differs
                                                              from what it renders (a test)
  scripts/docs_figures.py record NAME -- COMMAND [ARG...]     run COMMAND and save its JSON
                                                              lines as docs/figures/NAME.jsonl
  scripts/docs_figures.py record-ci [OUT_DIR]                 save CI's summary.json (build/ci)
                                                              as docs/figures/ci-cold.json or
                                                              ci-warm.json, by its caches
  scripts/docs_figures.py record-quickstart train|test TIMES --fresh TEXT
                                                              save a fresh machine's quickstart
                                                              phase times, TEXT saying what
                                                              'fresh' meant

The blocks and what renders each: BLOCKS below. Only the standard library is used.
"""
import datetime
import json
import os
import re
import shlex
import subprocess
import sys
import textwrap

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIGURES = os.path.join(ROOT, "docs", "figures")
DOCS = ["README.md"] + [os.path.join("docs", f) for f in sorted(os.listdir(os.path.join(ROOT, "docs")))
                        if f.endswith(".md")]
BLOCK = re.compile(r"(<!-- figures: ([a-z0-9-]+) -->\n)(.*?)(<!-- /figures -->)", re.S)


class Missing(Exception):
    """A figure's source file is missing or unreadable."""


# ---- the sources ------------------------------------------------------------------------

def machine():
    """This machine, as the figures name it."""
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    osname = "unknown system"
    try:
        for line in open("/etc/os-release"):
            if line.startswith("PRETTY_NAME="):
                osname = line.split("=", 1)[1].strip().strip('"')
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "os": osname}


def load_json(name):
    path = os.path.join(FIGURES, name)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise Missing(f"docs/figures/{name}: {e}")


def load_jsonl(name):
    """(header, records) of a file `record` wrote."""
    path = os.path.join(FIGURES, name + ".jsonl")
    try:
        with open(path) as f:
            lines = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        raise Missing(f"docs/figures/{name}.jsonl: {e}")
    if not lines or "figures" not in lines[0]:
        raise Missing(f"docs/figures/{name}.jsonl: no header line (write it with `record`)")
    return lines[0], lines[1:]


def ctest_count(build_dir):
    """How many tests the build registers (ctest -N)."""
    try:
        out = subprocess.run(["ctest", "--test-dir", build_dir, "-N"], capture_output=True, text=True,
                             timeout=120).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Missing(f"ctest -N in {build_dir}: {e}")
    m = re.search(r"Total Tests: (\d+)", out)
    if not m:
        raise Missing(f"ctest -N in {build_dir} printed no test count (is it a configured build?)")
    return int(m.group(1))


# ---- rendering helpers ------------------------------------------------------------------

def mmss(seconds):
    s = round(seconds)
    return f"{s // 60}:{s % 60:02d}"


def grouped(x, digits=0):
    return f"{x:,.{digits}f}"


def table(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def provenance(meta, command):
    m = meta["machine"]
    return (f"Measured {meta['date']} on {m['cpu']} ({m['cores']} cores), {m['os']}, "
            f"by `{command}`")


# ---- the blocks -------------------------------------------------------------------------

def ci_block(which):
    def render(ctx):
        s = load_json(f"ci-{which}.json")
        m = s["machine"]
        legs = [l for l in s["legs"] if l["leg"] != "roots"] + [l for l in s["legs"] if l["leg"] == "roots"]
        phases = ["root", "setup", "configure", "build", "test", "fuzz"]
        rows = []
        for leg in legs:
            p = leg.get("phases", {})
            t = leg.get("tests")
            tests = (f"{t['passed']} passed, {t['skipped']} skipped" + (f", {t['failed']} failed" if t["failed"] else "")
                     if t else "")
            budget = mmss(leg["budget"])
            if which == "cold" and leg["seconds"]:  # the headroom the budgets are set by
                budget += f" ({100 * (leg['budget'] - leg['seconds']) / leg['seconds']:+.0f}%)"
            rows.append([f"`{leg['leg']}`"] + [mmss(p[c]) if c in p else "" for c in phases] +
                        [f"**{mmss(leg['seconds'])}**", budget, tests])
        verdict = "passed" if all(l["status"] == "ok" for l in s["legs"]) else "failed"
        limit = s["total_budget"] if which == "cold" else s["warm_target"]
        text = (f"{'A fresh machine (no roots, no compiler caches, packages not installed)' if which == 'cold' else 'A machine with the caches of an earlier run'}, "
                f"{s['date']}, commit `{s['commit']}`, {m['cpu']} ({m['cores']} cores, "
                f"{m['memory_gib']} GiB), {m['os']}: **{mmss(s['total'])}** in all against "
                f"{'a budget' if which == 'cold' else 'a target'} of {mmss(limit)}, {verdict}; "
                f"{s['compilations']['compiled']} compilations, {s['compilations']['from_cache']} from the caches. "
                "The roots are made in the background, beside `debian12`.\n\n")
        text += table(["leg", "root", "setup", "configure", "build", "test", "fuzz", "time",
                       "budget (headroom)" if which == "cold" else "budget", "tests"], rows)
        text += f"\nThe ten slowest of its {s['test_runs']} test runs:\n\n"
        text += table(["test", "leg", "seconds"],
                      [[f"`{c['test']}`", c["leg"], f"{c['seconds']:.1f}"] for c in s["slowest"]])
        return text
    return render


def quickstart_block(ctx):
    rows, fresh = [], []
    for what in ("train", "test"):
        q = load_json(f"quickstart-{what}.json")
        p = q["phases"]
        rows.append([f"`scripts/quickstart.sh {what}`", q["date"], f"{q['machine']['cpu']}, {q['machine']['os']}"] +
                    [mmss(p[c]) if c in p else "" for c in
                     ("download", "install", "setup", "configure", "build", "train", "test")] +
                    [f"**{mmss(q['total'])}**"])
        fresh.append(f"`{what}`: {q.get('fresh', 'not recorded')}")
    return (table(["command", "date", "machine", "download", "install", "setup in all", "configure", "build",
                   "train", "test", "in all"], rows) +
            "\nWhat the machine had before: " + "; ".join(fresh) + ".\n")


def test_count_block(ctx):
    n = ctest_count(ctx["build_dir"])
    return f"`ctest -N` lists **{n} entries** in this build.\n"


def number(x):
    """A figure as the tables quote it: grouped thousands, three significant digits below."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return str(x)
    a = abs(x)
    if a >= 1000:
        return grouped(x)
    if a >= 100:
        return f"{x:.0f}"
    if a >= 1:
        return f"{x:.3g}" if a < 10 else f"{x:.1f}" if a < 100 else f"{x:.0f}"
    return f"{x:.3g}"


def bench_block(file, families):
    """Every record of a `tinylm bench` run whose case starts with one of `families`; where a
    case and metric come more than once (one per shape, per backend), the settings of its
    config that differ between them say which is which."""
    def render(ctx):
        meta, records = load_jsonl(file)
        chosen = [r for r in records if "metric" in r and
                  any(r["case"] == f or r["case"].startswith(f + "_") for f in families)]
        if not chosen:
            raise Missing(f"docs/figures/{file}.jsonl has no record of {', '.join(families)}")
        same = {}
        for r in chosen:
            same.setdefault((r["case"], r["metric"]), []).append(r.get("config") or {})
        def which(r):
            configs = same[(r["case"], r["metric"])]
            if len(configs) < 2:
                return ""
            keys = [k for k, v in (r.get("config") or {}).items()  # not a measured figure (a float)
                    if not isinstance(v, float) and len({json.dumps(c.get(k)) for c in configs}) > 1]
            return ", ".join(f"{k} {r['config'][k]}" for k in keys)
        rows = []
        for r in chosen:
            spread = f"{number(r['min'])}–{number(r['max'])}" if "min" in r and "max" in r else ""
            rows.append([f"`{r['case']}`", which(r), r["metric"], f"**{number(r['value'])}**", r["unit"], spread,
                         r.get("threads") if r.get("threads") is not None else ""])
        return (provenance(meta, meta["command"]) + " (median of its repetitions; min–max):\n\n" +
                table(["case", "of", "metric", "value", "unit", "min–max", "threads"], rows))
    return render


def pytorch_ratios(file):
    """{case: (median ratio record, [round records])} of a bench_pytorch.py run."""
    meta, records = load_jsonl(file)
    out = {}
    for r in records:
        if r["case"].endswith("_ratio"):
            case = r["case"][:-len("_ratio")]
            entry = out.setdefault(case, [None, []])
            if r["metric"] == "median_tinylm_over_pytorch":
                entry[0] = r
            else:
                entry[1].append(r)
    return meta, records, out


CASE_NAMES = {"p1": "P1, the reference run: training steps/s",
              "p2": "P2, 4 blocks, d 256, T 128: training tokens/s",
              "nanogpt": "nanoGPT's CPU recipe: iterations/s",
              "gpt2": "GPT-2-small shape, 12 blocks, d 768, T 256: training tokens/s"}


def curve_text(records):
    """The sentence on a bench_pytorch.py --curve run, "" where there was none."""
    curve = {r["metric"]: r for r in records if r["case"] == "nanogpt_curve"}
    if not curve:
        return ""
    a = curve["largest_step_difference_first_steps"]
    b = curve["largest_window_mean_difference"]
    bf16 = b.get("tinylm") == "bfloat16 products"
    step = (f"each step's losses within **{a['value']:.2g} nats** over the first {a['steps']} steps"
            + (" (no tolerance: bfloat16 rounds otherwise than float32)" if a.get("tolerance") is None
               else f" (tolerance {a['tolerance']:g})"))
    return (f"\nnanoGPT's recipe trained {b['steps']} steps in both from the same weights on the same batches"
            + (", tinylm with bfloat16 products, PyTorch in float32" if bf16 else "")
            + f": {step}, the means of every {b['window']} steps within **{b['value']:.2g} nats** "
            f"(tolerance {b['tolerance']:g}).\n")


def rest_of_step_text(records):
    """Issue 51's target as time: per round, what tinylm's step takes outside its linear
    products (its step less the products alone, the bench's products_ms) and what it may
    take at most to be half of the way from PyTorch to the ceiling (PyTorch's step over
    (1 + the most any program could lead by) / 2, less the same products), in ms a step;
    the medians of the rounds. Empty where the records lack the products' time."""
    by_round = {}
    for r in records:
        if "round" in r:
            by_round.setdefault((r["case"], r["metric"], r["round"]), r)
    rows = []
    for case in ["p1", "p2", "nanogpt", "gpt2"]:
        train = [r for r in records if r["case"] == f"{case}_bf16" and r["metric"] in ("train_tokens_per_s",
                                                                                      "ms_per_iter")]
        if not train:
            continue
        config = train[0]["config"]
        per_step = 1 if train[0]["metric"] == "ms_per_iter" else config["batch"] * config["seq"]
        now, allowed = [], []
        for (c, metric, rnd), ratio in sorted(by_round.items(), key=lambda kv: kv[0][2]):
            if (c, metric) != (f"{case}_bf16_ratio", "tinylm_bf16_over_pytorch_best"):
                continue
            lead = by_round.get((f"{case}_bf16_ceiling", "most_possible_lead", rnd))
            own = by_round.get((f"{case}_bf16_ceiling", "most_lead_on_tinylm_products", rnd))
            if not (lead and own):
                continue
            alone = own["products_seconds_per_unit"]
            half = (1.0 + lead["value"]) / 2
            now.append(1e3 * per_step * (1.0 / ratio["tinylm_bf16"] - alone))
            allowed.append(1e3 * per_step * (1.0 / (ratio["pytorch"] * half) - alone))
        if now:
            mid = lambda v: sorted(v)[len(v) // 2]
            rows.append([CASE_NAMES.get(case, case), f"{mid(now):.1f}", f"{mid(allowed):.1f}",
                         f"{mid(now) / mid(allowed):.2f}×" if mid(allowed) > 0 else "nothing is left"])
    if not rows:
        return ""
    return ("\nThe same target as time: what tinylm's step takes outside its linear products (the step less "
            "those products alone, `products_ms`), and the most it may take there for tinylm to be half of the "
            "way (PyTorch's step over the target's lead, less the same products), ms a step, medians of the "
            "rounds:\n\n" + table(["case", "outside the products now", "allowed for half of the way",
                                   "now / allowed"], rows))


def bf16_block(file):
    """A bench_pytorch.py --bf16 run: tinylm with bfloat16 products against tinylm float32
    and against PyTorch at its best (float32 or CPU autocast), each as the median of the
    rounds' ratios, with the utilisation of the bfloat16 peak."""
    def render(ctx):
        meta, records = load_jsonl(file)
        def rounds(case, metric):
            return [r for r in records if r["case"] == case and r["metric"] == metric]
        def median_of(values):
            values = sorted(values)
            return values[len(values) // 2]
        rows, ceilings = [], []
        for case in ["p1", "p2", "nanogpt", "gpt2"]:
            over32 = rounds(f"{case}_bf16_over_float32", "tinylm_bf16_over_tinylm_float32")
            overpt = rounds(f"{case}_bf16_ratio", "tinylm_bf16_over_pytorch_best")
            m32 = rounds(f"{case}_bf16_over_float32", "median_tinylm_bf16_over_tinylm_float32")
            mpt = rounds(f"{case}_bf16_ratio", "median_tinylm_bf16_over_pytorch_best")
            if not (over32 and overpt and m32 and mpt):
                continue
            modes = sorted({r["pytorch_mode"] for r in overpt})
            mfu = [r["value"] for r in records if r["case"] == f"{case}_bf16" and r["metric"] == "mfu"
                   and r.get("threads") == overpt[0]["tinylm_threads"]]
            # The ceiling (bench_pytorch.py since 2026-12-05): PyTorch's share of the bfloat16
            # peak, the most any program could lead it by, and (records since the second of
            # that day) the most tinylm could on its own products, were the rest of its step free.
            used = rounds(f"{case}_bf16_ceiling", "median_pytorch_best_mfu")
            lead = rounds(f"{case}_bf16_ceiling", "median_most_possible_lead")
            own = rounds(f"{case}_bf16_ceiling", "median_most_lead_on_tinylm_products")
            # Half of the way from PyTorch (1x) to the most any program could lead it by: the
            # target of issue 51, and whether the median ratio reaches it.
            half = (1.0 + lead[0]["value"]) / 2 if lead else None
            ceilings.append([f"{used[0]['value']:.0%}" if used else "", f"{lead[0]['value']:.2f}×" if lead else "",
                             f"{own[0]['value']:.2f}×" if own else "",
                             f"{half:.2f}× ({'reached' if mpt[0]['value'] >= half else 'not reached'})"
                             if half else ""])
            rows.append([CASE_NAMES.get(case, case),
                         number(median_of(r["tinylm_float32"] for r in over32)),
                         number(median_of(r["tinylm_bf16"] for r in over32)),
                         f"**{m32[0]['value']:.2f}×** ({', '.join(f'{x:.2f}' for x in m32[0]['all'])})",
                         f"{number(median_of(r['pytorch'] for r in overpt))} ({' / '.join(modes)})",
                         f"**{mpt[0]['value']:.2f}×** ({', '.join(f'{x:.2f}' for x in mpt[0]['all'])})",
                         f"{median_of(mfu):.0%}" if mfu else ""])
        if not rows:
            raise Missing(f"docs/figures/{file}.jsonl has no bfloat16 ratio records")
        peak = [r["value"] for r in records if r["case"] == "peak_bf16_onednn" and r["metric"] == "over_float32_peak"]
        header = ["case", "tinylm float32", "tinylm bfloat16", "bfloat16 / float32 (rounds)",
                  "PyTorch eager at its best", "tinylm bfloat16 / PyTorch (rounds)", "MFU (bfloat16 peak)"]
        if any(c[:2] != ["", ""] for c in ceilings):  # the ceiling's columns where the file has them
            header += ["PyTorch's MFU (bfloat16 peak)", "the most any program could lead PyTorch by"]
            if any(c[2] for c in ceilings):
                header.append("the most tinylm could on its own products")
            else:
                ceilings = [c[:2] + c[3:] for c in ceilings]
            header.append("half of the way from PyTorch to that ceiling")
            rows = [row + c for row, c in zip(rows, ceilings)]
        text = (provenance(meta, meta["command"]) + "; tinylm at 2 threads, PyTorch at its best thread setting and "
                "precision, rates the medians of the rounds:\n\n" + table(header, rows))
        text += rest_of_step_text(records)
        if peak:
            text += (f"\nThe bfloat16 matmul peak (oneDNN, 1024³) was **{median_of(peak):.2f}×** the best float32 "
                     f"peak in the same runs (median of {len(peak)}).\n")
        return text + curve_text(records)
    return render


def pytorch_block(file):
    def render(ctx):
        meta, records, ratios = pytorch_ratios(file)
        rows = []
        for case, (median, rounds) in ratios.items():
            if median is None or not rounds:
                continue
            mid = lambda key: sorted(r[key] for r in rounds)[len(rounds) // 2]
            threads = sorted({r["tinylm_threads"] for r in rounds})
            pt = rounds[0]["pytorch_threads"]
            rows.append([CASE_NAMES.get(case, case),
                         f"{number(mid('tinylm'))} ({'/'.join(map(str, threads))} thread{'s' if threads != [1] else ''})",
                         f"{number(mid('pytorch'))} (LibTorch {pt[0]}, BLAS {pt[1]} thread{'s' if pt[1] != 1 else ''})",
                         f"**{median['value']:.2f}×** ({', '.join(f'{x:.2f}' for x in median['all'])})"])
        if not rows:
            raise Missing(f"docs/figures/{file}.jsonl has no ratio records")
        text = (provenance(meta, meta["command"]) + "; each side at its best thread setting, rates the medians "
                "of the rounds:\n\n" +
                table(["case", "tinylm", "PyTorch eager (Python)", "tinylm / PyTorch, median (rounds)"], rows))
        return text + curve_text(records)
    return render


def generate_bf16_block(file):
    """A scripts/bench_bf16_generate.py run: greedy tokens/s in float32 and with bfloat16
    products, per checkpoint, and whether the text is the same."""
    def render(ctx):
        meta, records = load_jsonl(file)
        rows = []
        for r in records:
            if r["metric"] != "over_float32":
                continue
            rate = {x["case"]: x["value"] for x in records
                    if x["checkpoint"] == r["checkpoint"] and x["metric"] == "tokens_per_s"}
            same = ("yes" if r["same_greedy_text"] else
                    f"no: from byte {r['first_difference_byte']}, {r['float32_from_there']!r} against "
                    f"{r['bf16_from_there']!r}")
            rows.append([f"`{r['checkpoint']}`", number(rate["generate_float32"]), number(rate["generate_bf16"]),
                         f"**{r['value']:.2f}×**", same])
        if not rows:
            raise Missing(f"docs/figures/{file}.jsonl has no ratio records")
        return (provenance(meta, meta["command"]) + f" ({records[-1]['tokens']} greedy tokens after "
                f"\"{records[-1]['prompt']}\", medians of the rounds, float32 and bfloat16 in turn):\n\n" +
                table(["checkpoint", "float32 tokens/s", "bfloat16 tokens/s", "bfloat16 / float32",
                       "greedy text as float32's"], rows))
    return render


def gpu_check_block(file):
    """A scripts/check-gpu.sh run (on a machine with a GPU): one row per check, with what it
    measured."""
    def render(ctx):
        meta, records = load_jsonl(file)
        by = {r["check"]: r for r in records if "check" in r}
        machine = by.get("machine", {}).get("info")
        if not machine:
            raise Missing(f"docs/figures/{file}.jsonl has no machine line")
        rows = []
        for r in records:
            c = r.get("check")
            if c in (None, "machine"):
                continue
            if not r["ok"]:
                what = f"**failed**: {r.get('error', '')}"
            elif c == "build":
                what = f"{r['seconds']} s: {r['summary']}"
            elif c in ("cuda_tests", "sdpa"):
                what = r["result"]
            elif c == "reference":
                what = f"epoch means {', '.join(f'{m:.6f}' for m in r['epoch_means'])}; {r['final']}"
            elif c == "bf16":
                v = r["validation"]
                what = f"validation accuracy {100 * v['accuracy']:.2f}%, exact match {100 * v['exact_match']:.2f}%"
            elif c == "p2":
                what = (f"tinylm {number(r['tinylm_tokens_per_s'])} tokens/s, PyTorch eager "
                        f"{number(r['pytorch_eager_tokens_per_s'])}: **{r['tinylm_over_pytorch']:.2f}×**")
            elif c == "bf16_generate":
                # Per checkpoint, in the order check-gpu.sh gives them (the reference's, then
                # P2's): its two tokens/s lines, then its ratio line.
                parts, rate = [], {}
                for x in r["records"]:
                    if x["metric"] == "tokens_per_s":
                        rate[x["case"]] = x["value"]
                        continue
                    which = ["the reference", "P2"][len(parts)] if len(parts) < 2 else x["checkpoint"]
                    parts.append(f"{which}: {number(rate['generate_float32'])} → "
                                 f"{number(rate['generate_bf16'])} tokens/s (**{x['value']:.2f}×**), greedy text "
                                 + ("as float32's" if x["same_greedy_text"] else
                                    f"float32's up to byte {x['first_difference_byte']} "
                                    f"({x['float32_from_there'][:8]!r} against {x['bf16_from_there'][:8]!r})"))
                what = "; ".join(parts)
            else:
                what = "passed"
            rows.append([f"`{c}`", "yes" if r["ok"] else "**no**", what.replace("|", "\\|")])
        m = meta["machine"]
        return (f"Measured {meta['date']} on an {machine['gpu']} (PyTorch {machine['torch']}, CUDA {machine['cuda']}; "
                f"host {m['cpu']}, {m['cores']} cores, {m['os']}), by `{meta['command']}`:\n\n" +
                table(["check", "passed", "what it measured"], rows))
    return render


def eval_block(file):
    """The `tinylm eval --json` lines of a run of several checkpoints, one row each."""
    def render(ctx):
        meta, records = load_jsonl(file)
        rows = [[f"`{r['checkpoint']}`", r["step"], f"**{r['loss']:.4f}**", f"{r['perplexity']:.2f}",
                 f"{r['bits_per_byte']:.4f}" if "bits_per_byte" in r else "", f"{100 * r['accuracy']:.2f}%", r["tokens"]]
                for r in records if "checkpoint" in r]
        if not rows:
            raise Missing(f"docs/figures/{file}.jsonl has no evaluation")
        return (provenance(meta, meta["command"]) + ":\n\n" +
                table(["checkpoint", "step", "validation loss (nats/token)", "perplexity", "bits per byte", "accuracy",
                       "tokens scored"], rows))
    return render


def serve_block(file):
    """A scripts/bench_serve.py run: completions at 1, 8 and 64 clients (with its baseline
    build's, and the ratio, where it had one), the streamed speed against `tinylm sample`,
    and the peak RSS."""
    def render(ctx):
        meta, records = load_jsonl(file)
        runs = [r for r in records if r.get("case") == "completions_32_tokens"]
        if not runs:
            raise Missing(f"docs/figures/{file}.jsonl has no completions record")
        ratio = {r["clients"]: r["requests_per_s_ratio"] for r in records
                 if r.get("case") == "completions_over_baseline"}
        rows = [[r.get("build", "this"), r["clients"], f"**{r['requests_per_s']:.1f}**", f"{r['p50_ms']:.1f} ms",
                 f"{r['p99_ms']:.1f} ms", grouped(r["tokens_per_s"]), r["non_2xx"],
                 f"{ratio[r['clients']]:.2f}×" if r.get("build") == "this" and r["clients"] in ratio else ""]
                for r in runs]
        rounds = max(r.get("rounds", 1) for r in runs)
        how = (f" (each row its build's median of {rounds} rounds, run in turn with the baseline's; the ratio, "
               f"the median of the rounds' ratios)" if rounds > 1 else "")
        text = provenance(meta, meta["command"]) + how + ":\n\n" + table(
            ["build", "clients", "requests/s", "p50", "p99", "tokens/s", "errors", "over baseline"], rows)
        for r in records:
            if r.get("case") == "streamed_tokens":
                text += (f"\nStreaming {grouped(r['tokens'])} tokens to one client: {grouped(r['serve_tokens_per_s'])} "
                         f"tokens/s in {grouped(r['events'])} events, against {grouped(r['sample_tokens_per_s'])} for "
                         f"`tinylm sample` making as many: **{r['serve_over_sample']:.2f}×**.\n")
            if r.get("case") == "memory" and r.get("peak_rss_kib_at_1000"):
                text += (f"\nPeak RSS: {grouped(r['peak_rss_kib_at_1000'])} KiB after 1,000 requests, "
                         f"{grouped(r['peak_rss_kib_at_end'])} KiB after {grouped(r['requests'])} "
                         f"({100 * r['growth']:+.1f}%).\n")
        return text
    return render


def onnx_block(file):
    """A scripts/bench_onnx.py run: greedy tokens/s with the KV cache in each runtime, and
    each against `tinylm sample` in the same run."""
    def render(ctx):
        meta, records = load_jsonl(file)
        runs = [r for r in records if r.get("case") == "greedy_kv_cache"]
        if not runs:
            raise Missing(f"docs/figures/{file}.jsonl has no greedy_kv_cache record")
        rows = [[f"`{r['config']['checkpoint']}`", r["config"]["kind"], r["runtime"], f"**{grouped(r['tokens_per_s'])}**",
                 f"{r['over_tinylm_sample']:.2f}×"] for r in runs]
        return (provenance(meta, meta["command"]) + f" ({runs[0]['config']['tokens']} tokens after the prompt, "
                "greedy, one thread each; each runtime's generation loop alone, the median of its repeats):\n\n" +
                table(["checkpoint", "model", "runtime", "tokens/s", "over tinylm sample"], rows))
    return render


def readme_speed_block(ctx):
    meta, _, ratios = pytorch_ratios("pytorch-debian12")
    def r(case):
        if case not in ratios or ratios[case][0] is None:
            raise Missing(f"docs/figures/pytorch-debian12.jsonl has no {case} ratio")
        return f"{ratios[case][0]['value']:.1f}×"
    text = (f"- Speed: on a {meta['machine']['cores']}-core {meta['machine']['cpu']}, against the same loops in "
            f"PyTorch from Python at its best thread setting, the reference run trains {r('p1')} faster, the "
            f"4-block P2 model {r('p2')} and nanoGPT's CPU recipe {r('nanogpt')} (measured {meta['date']}; "
            f"[docs/performance.md](docs/performance.md)).")
    return "\n".join(textwrap.wrap(text, 90, subsequent_indent="  ", break_on_hyphens=False)) + "\n"


BLOCKS = {
    "ci-cold": ci_block("cold"),
    "ci-warm": ci_block("warm"),
    "quickstart": quickstart_block,
    "test-count": test_count_block,
    "readme-speed": readme_speed_block,
    "pytorch-debian12": pytorch_block("pytorch-debian12"),
    "pytorch-debian13": pytorch_block("pytorch-debian13"),
    "bench-peak": bench_block("bench-debian12", ["peak"]),
    "bench-p1": bench_block("bench-debian12", ["p1"]),
    "bench-p2": bench_block("bench-debian12", ["p2"]),
    "bench-p3": bench_block("bench-debian12", ["p3"]),
    "bench-attention": bench_block("bench-debian12", ["attention"]),
    "bench-debian13-attention": bench_block("bench-debian13-attention", ["attention"]),
    "bench-attention-bf16-zen4": bench_block("bench-attention-bf16-zen4", ["attention"]),
    "bench-gemm": bench_block("bench-debian12", ["gemm"]),
    "bench-nanogpt": bench_block("bench-debian12", ["nanogpt"]),
    "bench-data": bench_block("bench-debian12", ["prepare", "data"]),
    "bench-dp": bench_block("bench-dp", ["dp"]),
    "recipes-fortunes": eval_block("recipes-fortunes"),
    "bench-arch": bench_block("bench-arch", ["arch"]),
    "bench-decode": bench_block("bench-decode", ["decode"]),
    "bench-bf16-peak": bench_block("bench-bf16-peak", ["peak"]),
    "pytorch-bf16": bf16_block("pytorch-bf16"),
    "pytorch-bf16-zen4": bf16_block("pytorch-bf16-zen4"),
    "bf16-generate": generate_bf16_block("bf16-generate"),
    "bf16-generate-zen4": generate_bf16_block("bf16-generate-zen4"),
    "bench-gpt2-bf16": bench_block("bench-gpt2-bf16", ["gpt2"]),
    "serve-reference": serve_block("serve-reference"),
    "serve-p2": serve_block("serve-p2"),
    "serve-p2-epyc": serve_block("serve-p2-epyc"),
    "onnx-debian13": onnx_block("onnx-debian13"),
    "gpu-check": gpu_check_block("gpu-check"),
}


# ---- write, check, record ---------------------------------------------------------------

def render_doc(path, ctx):
    """(old text, new text, problems) of one document."""
    text = open(os.path.join(ROOT, path)).read()
    problems = []

    def one(m):
        name = m.group(2)
        if name not in BLOCKS:
            problems.append(f"{path}: unknown figures block '{name}' (known: {', '.join(sorted(BLOCKS))})")
            return m.group(0)
        try:
            body = BLOCKS[name](ctx)
        except Missing as e:
            problems.append(f"{path}: block '{name}': {e}")
            return m.group(0)
        return m.group(1) + body + m.group(4)

    return text, BLOCK.sub(one, text), problems


def main():
    args = sys.argv[1:]
    if not args or args[0] not in ("write", "check", "record", "record-ci", "record-quickstart"):
        sys.exit("usage: scripts/docs_figures.py write|check|record|record-ci|record-quickstart ..."
                 " (see the top of the script)")
    cmd = args.pop(0)
    if cmd in ("write", "check"):
        build_dir = os.path.join(ROOT, "build", "release")
        if args[:1] == ["--build-dir"] and len(args) == 2:
            build_dir = args[1]
        elif args:
            sys.exit(f"docs_figures: {cmd}: unexpected arguments {args} (only --build-dir DIR)")
        ctx = {"build_dir": build_dir}
        failed = False
        for path in DOCS:
            old, new, problems = render_doc(path, ctx)
            for p in problems:
                print(f"docs_figures: {p}", file=sys.stderr)
                failed = True
            if new != old:
                if cmd == "write":
                    tmp = os.path.join(ROOT, path + ".tmp")
                    with open(tmp, "w") as f:
                        f.write(new)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, os.path.join(ROOT, path))
                    print(f"docs_figures: wrote {path}")
                else:
                    print(f"docs_figures: {path}: its figures differ from what the commands printed: "
                          "run scripts/docs_figures.py write (and commit)", file=sys.stderr)
                    import difflib
                    sys.stderr.writelines(list(difflib.unified_diff(old.splitlines(True), new.splitlines(True),
                                                                    path, path + " (rendered)"))[:60])
                    failed = True
        n = sum(len(BLOCK.findall(open(os.path.join(ROOT, p)).read())) for p in DOCS)
        if not failed:
            print(f"docs_figures: {n} generated blocks " + ("written" if cmd == "write" else "agree with their sources"))
        sys.exit(1 if failed else 0)
    os.makedirs(FIGURES, exist_ok=True)
    today = datetime.date.today().isoformat()
    if cmd == "record":
        if len(args) < 3 or args[1] != "--" or not re.fullmatch(r"[a-z0-9-]+", args[0]):
            sys.exit("usage: scripts/docs_figures.py record NAME -- COMMAND [ARG...]  (NAME: a-z, 0-9, -)")
        name, command = args[0], args[2:]
        proc = subprocess.run(command, stdout=subprocess.PIPE, text=True)
        if proc.returncode != 0:
            sys.exit(f"docs_figures: {shlex.join(command)} failed (status {proc.returncode}); nothing saved")
        records = []
        for line in proc.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                records.append(json.loads(line))
        if not records:
            sys.exit(f"docs_figures: {shlex.join(command)} printed no JSON line; nothing saved")
        header = {"figures": name, "date": today, "machine": machine(), "command": shlex.join(command)}
        write_atomic(os.path.join(FIGURES, name + ".jsonl"),
                     "".join(json.dumps(r) + "\n" for r in [header] + records))
        print(f"docs_figures: {len(records)} records saved in docs/figures/{name}.jsonl")
    elif cmd == "record-ci":
        out = args[0] if args else os.path.join(ROOT, "build", "ci")
        s = json.load(open(os.path.join(out, "summary.json")))
        if s["caches"] not in ("cold", "warm"):
            sys.exit(f"docs_figures: that run's caches were {s['caches']} ({s.get('caches_note', '')}): "
                     "neither a fresh machine's run nor a warm one; nothing saved")
        name = f"ci-{s['caches']}.json"
        write_atomic(os.path.join(FIGURES, name), json.dumps(s, indent=1) + "\n")
        print(f"docs_figures: CI's summary saved as docs/figures/{name}")
    else:
        if len(args) != 4 or args[0] not in ("train", "test") or args[2] != "--fresh" or not args[3].strip():
            sys.exit("usage: scripts/docs_figures.py record-quickstart train|test TIMES_FILE --fresh "
                     "'what the machine had before (packages, caches)'")
        phases = {}
        for line in open(args[1]):
            name, ms, status = line.split()
            if status != "0":
                sys.exit(f"docs_figures: {args[1]}: phase {name} failed (status {status}); nothing saved")
            phases[name] = round(phases.get(name, 0) + int(ms) / 1000, 1)
        # download and install are setup's parts, not phases beside it.
        total = sum(v for k, v in phases.items() if k not in ("download", "install"))
        q = {"date": today, "machine": machine(), "fresh": args[3].strip(), "phases": phases,
             "total": round(total, 1)}
        write_atomic(os.path.join(FIGURES, f"quickstart-{args[0]}.json"), json.dumps(q, indent=1) + "\n")
        print(f"docs_figures: saved docs/figures/quickstart-{args[0]}.json")


def write_atomic(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


if __name__ == "__main__":
    main()
