#!/usr/bin/env python3
"""Greedy generation with the KV cache, tokens/s: `tinylm sample` against the same model
exported as ONNX and run by ONNX Runtime in Python, in C++ (tests/onnx/ort_generate.cpp,
built where libonnxruntime-dev is) and in the page of `tinylm export --format web` (ONNX
Runtime Web in headless Chromium). Each times its own generation loop alone (after
loading), one thread each, --repeats times (the median kept); each runtime's text must be
tinylm's. Unless --checkpoint is given (repeatable): the reference run's checkpoint and a
P2-shaped one (4 blocks, width 256, 8 heads, context 128, 256 byte tokens; 20 steps of
the copy task), both trained into a scratch folder. One JSON object per line, then a
summary line.
ONNX Runtime's Python and C++ runs need Debian 13's packages (run this in its root there);
a runtime that is absent is left out, saying so.
usage: scripts/bench_onnx.py [--tinylm build/release/tinylm] [--checkpoint [NAME=]CKPT]...
                             [--ort-generate build/release/tests/tinylm_ort_generate]
                             [--tokens 200] [--repeats 3] [--no-browser]"""
import argparse
import functools
import http.server
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--tinylm", default=os.path.join(here, "..", "build", "release", "tinylm"))
p.add_argument("--checkpoint", action="append",
               help="[NAME=]checkpoint or run directory, repeatable (default: the reference run and P2, trained)")
p.add_argument("--ort-generate", default=os.path.join(here, "..", "build", "release", "tests", "tinylm_ort_generate"))
p.add_argument("--tokens", type=int, default=200, help="tokens generated after the prompt")
p.add_argument("--repeats", type=int, default=3)
p.add_argument("--no-browser", action="store_true", help="leave out the web page")
a = p.parse_args()
if not os.path.exists(a.tinylm):
    sys.exit("bench_onnx: no tinylm at %s: build it, or give --tinylm PATH" % a.tinylm)


def run(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit("bench_onnx: %s failed:\n%s%s" % (" ".join(cmd), r.stdout, r.stderr[-2000:]))
    return r


def median_rate(rates):
    return statistics.median(rates)


work = tempfile.mkdtemp(prefix="bench_onnx.")
results = []
try:
    checkpoints = a.checkpoint or []
    if not checkpoints:
        ref, p2 = os.path.join(work, "reference"), os.path.join(work, "p2")
        run(a.tinylm, "train", "--out-dir", ref)
        run(a.tinylm, "train", "--model", "transformer", "--n-layers", "4", "--d-model", "256", "--n-heads", "8",
            "--seq-len", "128", "--vocab-size", "256", "--batch-size", "8", "--task", "copy", "--epochs", "1",
            "--steps-per-epoch", "20", "--log-every", "10", "--eval-every", "20", "--eval-batches", "1",
            "--out-dir", p2)
        checkpoints = ["reference=" + ref, "p2=" + p2]
    try:
        import numpy as np
        import onnxruntime
    except ImportError:
        onnxruntime = None
        print("note: ONNX Runtime for Python is not installed (Debian 13: python3-onnxruntime): left out")
    ort_generate = a.ort_generate if os.path.exists(a.ort_generate) else None
    if not ort_generate:
        print("note: no %s (built where libonnxruntime-dev is): ONNX Runtime's C++ API left out" % a.ort_generate)
    ort_web = None
    if not a.no_browser:
        where = subprocess.run(["bash", os.path.join(here, "onnxruntime-web.sh"), "--where"], capture_output=True,
                               text=True)
        ort_web = where.stdout.strip() if where.returncode == 0 else None
        if not ort_web:
            print("note: ONNX Runtime Web is not fetched (scripts/onnxruntime-web.sh): the page left out")

    for index, given in enumerate(checkpoints):
        name, _, ckpt = given.rpartition("=")
        name = name or os.path.basename(os.path.normpath(ckpt))
        card = json.loads(run(a.tinylm, "inspect", ckpt, "--json").stdout)
        kind = (card.get("tokenizer") or {}).get("kind", "ids")
        prompt = "Once upon a time" if kind == "byte" else "1 2 3 4"
        prompt_ids = list(prompt.encode()) if kind == "byte" else [int(t) for t in prompt.split()]
        config = {"checkpoint": name, "kind": card["model"]["kind"], "tokenizer": kind, "tokens": a.tokens}
        model = os.path.join(work, "m%d.kv.onnx" % index)
        run(a.tinylm, "export", ckpt, "--format", "onnx", "--kv-cache", "--out", model)
        rates, text = [], None
        for _ in range(a.repeats):
            r = run(a.tinylm, "sample", ckpt, "--prompt", prompt, "--greedy", "--max-new-tokens", str(a.tokens),
                    "--time")
            rates.append(float(re.search(r"([\d.]+) tokens/s", r.stderr).group(1)))
            text = r.stdout.rstrip("\n")
        measured = {"tinylm sample": median_rate(rates)}
        expected_ids = None if kind == "byte" else text

        if onnxruntime:
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            s = onnxruntime.InferenceSession(model, options, providers=["CPUExecutionProvider"])
            C = int(s.get_modelmeta().custom_metadata_map["tinylm.context_length"])
            pasts = [i for i in s.get_inputs() if i.name.startswith("past_key_values.")]
            wanted = ["logits"] + [i.name.replace("past_key_values", "present") for i in pasts]
            empty = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32) for i in pasts}
            rates = []
            for _ in range(a.repeats):
                start = time.perf_counter()
                seq = list(prompt_ids)
                feeds = dict(empty, input_ids=np.array([seq[-C:]], dtype=np.int64))
                for i in range(a.tokens):
                    logits, *present = s.run(wanted, feeds)
                    seq.append(int(logits[0, -1].argmax()))
                    if i == a.tokens - 1:
                        break
                    if present[0].shape[2] < C:
                        feeds = dict(zip((i.name for i in pasts), present), input_ids=np.array([seq[-1:]], np.int64))
                    else:
                        feeds = dict(empty, input_ids=np.array([seq[-C:]], dtype=np.int64))
                rates.append(a.tokens / (time.perf_counter() - start))
            got = bytes(seq).decode("utf-8", "replace") if kind == "byte" else " ".join(map(str, seq))
            if got != text:
                sys.exit("bench_onnx: %s: ONNX Runtime (Python) generated %r, tinylm %r" % (name, got[:200], text[:200]))
            measured["onnxruntime python"] = median_rate(rates)

        if ort_generate:
            rates = []
            for _ in range(a.repeats):
                r = run(ort_generate, model, " ".join(map(str, prompt_ids)), str(a.tokens), "--time")
                rates.append(float(re.search(r"([\d.]+) tokens/s", r.stderr).group(1)))
                if expected_ids is not None and r.stdout.strip() != expected_ids:
                    sys.exit("bench_onnx: %s: ONNX Runtime (C++) generated another text" % name)
            measured["onnxruntime c++"] = median_rate(rates)

        if ort_web:
            from selenium import webdriver
            from selenium.webdriver.chrome.service import Service
            from selenium.webdriver.common.by import By
            page = os.path.join(work, "page%d" % index)
            run(a.tinylm, "export", ckpt, "--format", "web", "--out", page, "--onnxruntime-web", ort_web)
            class Quiet(http.server.SimpleHTTPRequestHandler):
                def log_message(self, *args):
                    pass

            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=page))
            threading.Thread(target=server.serve_forever, daemon=True).start()
            options = webdriver.ChromeOptions()
            options.binary_location = shutil.which("chromium")
            for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                        "--user-data-dir=" + os.path.join(work, "profile%d" % index)):
                options.add_argument(arg)
            driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"),
                                      options=options)
            try:
                driver.get("http://127.0.0.1:%d/" % server.server_address[1])
                state = lambda: driver.execute_script("return document.body.dataset.state")  # noqa: E731
                end = time.time() + 60
                while state() == "loading" and time.time() < end:
                    time.sleep(0.05)
                for element, value in (("prompt", prompt), ("tokens", str(a.tokens))):
                    box = driver.find_element(By.ID, element)
                    box.clear()
                    box.send_keys(value)
                rates = []
                for _ in range(a.repeats):
                    driver.find_element(By.ID, "go").click()
                    end = time.time() + 300
                    while state() in ("ready", "running", "done") and time.time() < end:
                        if state() == "done" and driver.find_element(By.ID, "go").is_enabled():
                            break
                        time.sleep(0.05)
                    if state() != "done":
                        sys.exit("bench_onnx: %s: the page is %s" % (name, state()))
                    rates.append(float(driver.execute_script("return document.body.dataset.tokensPerSecond")))
                    got = driver.execute_script("return document.getElementById('output').textContent")
                    if got != text:
                        sys.exit("bench_onnx: %s: the page generated %r, tinylm %r" % (name, got[:200], text[:200]))
                    driver.execute_script("document.body.dataset.state = 'ready'")
                measured["browser page"] = median_rate(rates)
            finally:
                driver.quit()
                server.shutdown()

        base = measured["tinylm sample"]
        for runtime, rate in measured.items():
            line = {"case": "greedy_kv_cache", "runtime": runtime, "tokens_per_s": round(rate, 1),
                    "over_tinylm_sample": round(rate / base, 3), "config": config}
            results.append(line)
            print(json.dumps(line), flush=True)
    print("summary: " + "; ".join("%s %s %.0f tokens/s (%.2fx)" % (r["config"]["checkpoint"], r["runtime"],
                                                                   r["tokens_per_s"], r["over_tinylm_sample"])
                                  for r in results))
finally:
    shutil.rmtree(work, ignore_errors=True)
