#!/usr/bin/env python3
"""Benchmarks `tinylm serve` (docs/serve.md has the figures):
  - requests/s and p50/p99 latency of a 32-token completion at 1, 8 and 64 concurrent
    clients, measured by wrk (Debian's `wrk`) over keep-alive connections;
  - streamed tokens/s of one client against `tinylm sample` on the same checkpoint;
  - peak RSS of the server after 1,000 and after 10,000 requests (flat: within 10%).
With --baseline OTHER_TINYLM, the completions are also measured on a server of that build
(an earlier tinylm), each concurrency --rounds times on both in turn (baseline, this,
baseline, this, ...), each build's median round kept and the median of the rounds' ratios
printed: figures of one run, on one machine, minutes apart at most.
One JSON object per line, then a summary line.
usage: scripts/bench_serve.py [--tinylm build/release/tinylm] [--checkpoint CKPT|RUN_DIR]
                              [--seconds 10] [--requests 10000] [--workers 0] [--quick]
                              [--threads 1] [--baseline OTHER_TINYLM [--rounds 3]]
Without --checkpoint it trains the reference run into a scratch directory first."""
import argparse
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "serve"))
from serving import Server  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
p.add_argument("--tinylm", default=os.path.join(here, "..", "build", "release", "tinylm"))
p.add_argument("--checkpoint", help="checkpoint or run directory (default: train the reference run)")
p.add_argument("--seconds", type=float, default=10, help="wrk's duration per concurrency")
p.add_argument("--requests", type=int, default=10000, help="requests for the memory check")
p.add_argument("--workers", default="0", help="serve --workers (0 = the CPUs)")
p.add_argument("--threads", default="1", help="serve --threads, for both builds (intra-op threads)")
p.add_argument("--stream-tokens", type=int, default=10000, help="tokens of the streamed-speed comparison")
p.add_argument("--quick", action="store_true", help="a smoke run: 1 s per concurrency, 1,000 requests")
p.add_argument("--baseline", help="another tinylm build whose completions are measured too, for ratios")
p.add_argument("--rounds", type=int, default=3, help="with --baseline: rounds per concurrency on each build, in turn")
a = p.parse_args()
if a.quick:
    a.seconds, a.requests, a.stream_tokens, a.rounds = 1, 1000, 2000, 1
wrk = shutil.which("wrk")
if not wrk:
    sys.exit("bench_serve: wrk is not installed (scripts/setup.sh installs it: apt-get install wrk)")
if not os.path.exists(a.tinylm):
    sys.exit("bench_serve: no tinylm at %s: build it, or give --tinylm PATH" % a.tinylm)
if a.baseline and not os.path.exists(a.baseline):
    sys.exit("bench_serve: no baseline tinylm at %s" % a.baseline)

work = tempfile.mkdtemp(prefix="bench_serve.")
try:
    ckpt = a.checkpoint
    if not ckpt:
        ckpt = os.path.join(work, "run")
        subprocess.run([a.tinylm, "train", "--out-dir", ckpt], check=True, capture_output=True)
    serve_flags = ("--workers", a.workers, "--threads", a.threads, "--queue", "256", "--max-connections", "256",
                   "--max-tokens", str(max(32, a.stream_tokens)))
    srv = Server(a.tinylm, ckpt, *serve_flags, work=work)
    base = Server(a.baseline, ckpt, *serve_flags, work=work) if a.baseline else None
    model = srv.request("GET", "/v1/models")[2]["data"][0]
    card = model["card"]
    prompt = "3 4 5" if card["tokenizer"] is None or card["tokenizer"]["kind"] == "ids" else "Once upon a time"
    body = json.dumps({"prompt": prompt, "max_tokens": 32, "temperature": 1.0})
    script = os.path.join(work, "post.lua")
    with open(script, "w") as f:
        f.write('wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\nwrk.body = %s\n'
                % json.dumps(body))
    results = []

    def to_ms(text):
        m = re.match(r"([\d.]+)(us|ms|s)", text)
        v = float(m.group(1))
        return v / 1000 if m.group(2) == "us" else v * 1000 if m.group(2) == "s" else v

    def completions(server, clients, build):
        out = subprocess.run([wrk, "-t", str(min(clients, 2)), "-c", str(clients), "-d", "%gs" % a.seconds,
                              "--latency", "-s", script, "http://%s:%d/v1/completions" % (server.host, server.port)],
                             capture_output=True, text=True, check=True).stdout
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
        p50 = to_ms(re.search(r"\s50%\s+(\S+)", out).group(1))
        p99 = to_ms(re.search(r"\s99%\s+(\S+)", out).group(1))
        errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
        r = {"case": "completions_round", "build": build, "clients": clients, "requests_per_s": rps,
             "p50_ms": p50, "p99_ms": p99, "tokens_per_s": rps * 32,
             "non_2xx": int(errors.group(1)) if errors else 0}
        print(json.dumps(r), flush=True)
        return r

    def median(rows, key):
        return sorted(rows, key=key)[len(rows) // 2]

    # With a baseline, each concurrency runs --rounds times on both builds in turn (baseline,
    # this, baseline, this, ...): the rows kept are each build's median round, and the ratio
    # is the median of the rounds' ratios, which a noisy machine moves less than one pair.
    rounds = a.rounds if base else 1
    for clients in (1, 8, 64):
        pairs = []
        for _ in range(rounds):
            before = completions(base, clients, "baseline") if base else None
            pairs.append((before, completions(srv, clients, "this")))
        kept = []
        if base:
            kept.append(median([b for b, _ in pairs], lambda x: x["requests_per_s"]))
        r = median([t for _, t in pairs], lambda x: x["requests_per_s"])
        kept.append(r)
        results.append(r)
        for k in kept:
            print(json.dumps(dict(k, case="completions_32_tokens", rounds=rounds)), flush=True)
        if base:
            ratio = median([t["requests_per_s"] / b["requests_per_s"] for b, t in pairs], lambda x: x)
            print(json.dumps({"case": "completions_over_baseline", "clients": clients, "rounds": rounds,
                              "requests_per_s_ratio": ratio, "p99_ms": r["p99_ms"],
                              "baseline_p99_ms": kept[0]["p99_ms"]}), flush=True)
    if base:
        base.stop()

    # Streamed tokens/s of one client, and `tinylm sample` making as many tokens (its time
    # less that of making none: process start and loading are not generation).
    n = a.stream_tokens

    def stream_once():
        """Seconds from sending the request to the stream's end, read from a plain socket."""
        req = json.dumps({"prompt": prompt, "max_tokens": n, "stream": True, "seed": 1}).encode()
        s = socket.create_connection((srv.host, srv.port))
        t = time.perf_counter()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nContent-Type: application/json\r\nConnection: close\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(req) + req)
        got = []
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            got.append(chunk)
        seconds = time.perf_counter() - t
        s.close()
        return seconds, b"".join(got).count(b"data: {")

    stream_s, events = min(stream_once() for _ in range(3))

    def sample(tokens):
        t = time.perf_counter()
        subprocess.run([a.tinylm, "sample", ckpt, "--prompt", prompt, "--max-new-tokens", str(tokens), "--seed", "1"],
                       check=True, capture_output=True)
        return time.perf_counter() - t

    runs = 2 if a.quick else 5
    sample_s = min(sample(n) for _ in range(runs)) - min(sample(0) for _ in range(runs))
    r = {"case": "streamed_tokens", "tokens": n, "events": events, "serve_tokens_per_s": n / stream_s,
         "sample_tokens_per_s": n / max(sample_s, 1e-6), "serve_over_sample": sample_s / stream_s}
    results.append(r)
    print(json.dumps(r), flush=True)

    # Peak RSS after 1,000 and after all requests (8 keep-alive clients).
    done = [0]
    lock = threading.Lock()
    marks = {}

    def client(count):
        c = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
        for _ in range(count):
            c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
            resp = c.getresponse()
            resp.read()
            if resp.status != 200:
                raise SystemExit("bench_serve: a request failed with %d" % resp.status)
            with lock:
                done[0] += 1
                if done[0] == 1000:
                    marks[1000] = peak_rss(srv.proc.pid)
        c.close()

    def peak_rss(pid):
        with open("/proc/%d/status" % pid) as f:
            return int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1))

    threads = [threading.Thread(target=client, args=(a.requests // 8,)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    marks[done[0]] = peak_rss(srv.proc.pid)
    first, last = marks.get(1000, 0), marks[done[0]]
    r = {"case": "memory", "requests": done[0], "peak_rss_kib_at_1000": first, "peak_rss_kib_at_end": last,
         "growth": last / first - 1 if first else None, "flat_within_10pct": bool(first) and last <= 1.1 * first}
    results.append(r)
    print(json.dumps(r), flush=True)
    status = srv.stop()
    if status != 0:
        sys.exit("bench_serve: serve exited %d after SIGTERM" % status)
    by = {x["clients"]: x for x in results if "clients" in x}
    print("summary: %s req/s at 1/8/64 clients (p99 %s ms); streamed %.0f tokens/s vs sample %.0f; "
          "peak RSS %d -> %d KiB over %d requests (%+.1f%%)"
          % ("/".join("%.0f" % by[c]["requests_per_s"] for c in (1, 8, 64)),
             "/".join("%.1f" % by[c]["p99_ms"] for c in (1, 8, 64)),
             results[3]["serve_tokens_per_s"], results[3]["sample_tokens_per_s"], first, last, done[0],
             100 * (r["growth"] or 0)))
finally:
    shutil.rmtree(work, ignore_errors=True)
