#!/usr/bin/env python3
"""`tinylm serve` under load that stays up: 64 clients at once for 10,000 requests (2,000
with TINYLM_TEST_SMALL=1), streamed and plain mixed, some leaving mid-stream. Every request
that stays is answered whole, nothing is left in the decode batch afterwards, and the
server's resident memory after 1,000 requests and at the end differs by under 10%.
Standard library only.
usage: test_soak.py path/to/tinylm scratch-dir"""
import http.client
import json
import os
import socket
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serving import Server, check, fresh_run, sse_events, wait_for  # noqa: E402

tinylm, work = sys.argv[1], sys.argv[2]
run = fresh_run(tinylm, work)
total = 2000 if os.environ.get("TINYLM_TEST_SMALL") == "1" else 10000
clients = 64

srv = Server(tinylm, run, "--max-batch", "64", "--decoders", "2", "--queue", "256", "--max-connections", "256", work=work)
lock = threading.Lock()
counts = {"sent": 0, "plain": 0, "streamed": 0, "left": 0}
failures = []
rss = {}


def one(i):
    """Request i: plain, streamed, or (one in ten) a stream its client leaves after the first event."""
    body = {"prompt": "%d %d %d" % (i % 64, (i * 7) % 64, (i * 13) % 64), "max_tokens": 8 + i % 25,
            "seed": i, "temperature": 0.9}
    kind = "left" if i % 10 == 3 else "streamed" if i % 2 else "plain"
    if kind == "left":
        data = json.dumps(dict(body, stream=True)).encode()
        s = socket.create_connection((srv.host, srv.port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(data) + data)
        got = s.recv(4096)
        s.close()  # mid-stream
        if b"200 OK" not in got:
            return "left: %r" % got[:80]
        return kind
    c = http.client.HTTPConnection(srv.host, srv.port, timeout=60)
    if kind == "streamed":
        body.update(stream=True, stream_options={"include_usage": True})
    c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    text = r.read().decode("utf-8", "replace")
    c.close()
    if r.status != 200:
        return "%s: status %d %s" % (kind, r.status, text[:200])
    if kind == "plain":
        usage = json.loads(text)["usage"]
    else:
        events = sse_events(text)
        if events[-1] != "[DONE]":
            return "streamed: no [DONE]: %r" % events[-2:]
        usage = json.loads(events[-2])["usage"]
    if usage["completion_tokens"] != body["max_tokens"]:
        return "%s: %d tokens, asked %d" % (kind, usage["completion_tokens"], body["max_tokens"])
    return kind


def client():
    while True:
        with lock:
            if counts["sent"] >= total:
                return
            i = counts["sent"]
            counts["sent"] += 1
        try:
            result = one(i)
        except OSError as e:
            result = "request %d: %s" % (i, e)
        with lock:
            if result in counts:
                counts[result] += 1
            else:
                failures.append(result)
            done = counts["plain"] + counts["streamed"] + counts["left"] + len(failures)
            if done == 1000:
                rss[1000] = srv.rss_kib()


threads = [threading.Thread(target=client) for _ in range(clients)]
for t in threads:
    t.start()
for t in threads:
    t.join(600)
check(not any(t.is_alive() for t in threads), "clients still running after 600 s")
check(not failures, "%d requests failed, the first: %s" % (len(failures), failures[:3]))
# What the departed clients held is freed: nothing decodes or waits once all are answered.
wait_for(lambda: srv.health()["batch"]["completions"] == 0, 10, "every completion slot to be free")
h = srv.health()
check(h["batch"]["decoding"] == 0 and h["batch"]["joining"] == 0, "left in the batch: %r" % h["batch"])
check(h["batch"]["widest"] >= 8, "64 clients were not decoded together: %r" % h["batch"])
end = srv.rss_kib()
check(rss.get(1000, 0) > 0 and end <= 1.1 * rss[1000],
      "resident memory grew from %d KiB after 1,000 requests to %d KiB after %d" % (rss.get(1000, 0), end, total))
check(srv.stop() == 0, "exit status after SIGTERM")
print("ok: %d requests from %d clients (%d plain, %d streamed, %d left mid-stream); widest batch %d; "
      "RSS %d -> %d KiB" % (total, clients, counts["plain"], counts["streamed"], counts["left"],
                           h["batch"]["widest"], rss[1000], end))
