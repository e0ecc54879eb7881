#!/usr/bin/env python3
"""`tinylm export --format web` end to end: a byte-level transformer and an id-level tiny
model are exported as pages, each served by a local static file server, opened in headless
Chromium (chromium-driver through Selenium), given a prompt, and must generate greedily
exactly what `tinylm sample --greedy` prints (past the context), with the attention of the
newest token shown, no console error and no request for anything but the page's own
files. Also: what the export refuses, and a replaced page. Prints the browser's tokens/s.
usage: test_web_export.py path/to/tinylm SOURCE_DIR scratch-dir
Exits 77 (skipped) where Chromium, its driver, Selenium or ONNX Runtime Web (fetched by
scripts/setup.sh --test from the npm registry) is absent."""
import functools
import http.server
import os
import shutil
import subprocess
import sys
import threading
import time

tinylm, source, work = sys.argv[1:4]
sys.path.insert(0, os.path.join(source, "tests", "serve"))
from serving import check, chromium, train  # noqa: E402

where = subprocess.run(["bash", os.path.join(source, "scripts", "onnxruntime-web.sh"), "--where"],
                       capture_output=True, text=True)
if where.returncode != 0:
    print("SKIPPED: ONNX Runtime Web is not fetched (scripts/setup.sh --test fetches it: scripts/onnxruntime-web.sh)")
    sys.exit(77)
ort_web = where.stdout.strip()

shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
text_file = os.path.join(work, "text.txt")
with open(text_file, "w") as f:
    f.write("the cat sat on the mat. the dog sat on the log. " * 300)
runs = {
    # Bytes, 2 layers x 2 heads, context 16: 30 new tokens go past it.
    "text": (train(tinylm, work, "text", "--task", "text", "--data", text_file, "--vocab-size", "256", "--model",
                   "transformer", "--n-layers", "2", "--d-model", "32", "--n-heads", "2", "--context-length", "16",
                   "--seq-len", "16", "--epochs", "2", "--steps-per-epoch", "40"), "the cat"),
    # Token ids, the tiny model (context 12).
    "ids": (train(tinylm, work, "ids", "--model", "tiny", "--task", "copy", "--epochs", "1", "--steps-per-epoch", "150"),
            "5 1 4 2"),
}


def export(run, out, *flags):
    return subprocess.run([tinylm, "export", run, "--format", "web", "--out", out, *flags], capture_output=True,
                          text=True)


# What the export refuses, and what it replaces.
page = os.path.join(work, "page")
r = export(runs["ids"][0], page)
check(r.returncode != 0 and "give --onnxruntime-web DIR" in r.stderr, "no --onnxruntime-web: %r" % r.stderr)
r = export(runs["ids"][0], page, "--onnxruntime-web", work)
check(r.returncode != 0 and "no ort.wasm.min.js" in r.stderr, "a folder without the runtime: %r" % r.stderr)
check(not os.path.exists(page), "a refused export wrote %s" % page)
os.makedirs(os.path.join(work, "mine"))
with open(os.path.join(work, "mine", "notes.txt"), "w") as f:
    f.write("mine")
r = export(runs["ids"][0], os.path.join(work, "mine"), "--onnxruntime-web", ort_web)
check(r.returncode != 0 and "already exists" in r.stderr, "an existing folder: %r" % r.stderr)
r = export(runs["ids"][0], os.path.join(work, "mine"), "--onnxruntime-web", ort_web, "--overwrite")
check(r.returncode != 0 and "not a page tinylm wrote" in r.stderr, "--overwrite on a folder of mine: %r" % r.stderr)
check(os.listdir(os.path.join(work, "mine")) == ["notes.txt"], "a refused export changed a folder of mine")
r = subprocess.run([tinylm, "export", runs["ids"][0], "--format", "onnx", "--out", os.path.join(work, "m.onnx"),
                    "--onnxruntime-web", ort_web], capture_output=True, text=True)
check(r.returncode != 0 and "--onnxruntime-web is for --format web" in r.stderr, "--onnxruntime-web with onnx: %r"
      % r.stderr)
leftovers = [n for n in os.listdir(work) if ".partial-" in n or ".replaced-" in n]
check(not leftovers, "an export left %r" % leftovers)


class Files(http.server.SimpleHTTPRequestHandler):
    """A static file server that remembers every path asked of it."""
    asked = []

    def log_message(self, *args):
        pass

    def do_GET(self):
        Files.asked.append(self.path)
        super().do_GET()


driver = chromium(work)  # (or skipped, saying what is missing)
from selenium.webdriver.common.by import By  # noqa: E402

speeds = []
try:
    for name, (run, prompt) in runs.items():
        page = os.path.join(work, name + "-page")
        for attempt in ("first", "again"):  # the second replaces the first (--overwrite)
            r = export(run, page, "--onnxruntime-web", ort_web, *(["--overwrite"] if attempt == "again" else []))
            check(r.returncode == 0, "%s: export --format web (%s): %s" % (name, attempt, r.stderr))
        files = sorted(os.listdir(page))
        for f in ("index.html", "tinylm-web.js", "tinylm-web.css", "model.onnx", "model.json", "ort.wasm.min.js",
                  "ort-wasm-simd-threaded.wasm", "ort-wasm-simd-threaded.mjs"):
            check(f in files, "%s: the page has no %s: %r" % (name, f, files))
        want = subprocess.run([tinylm, "sample", run, "--prompt", prompt, "--greedy", "--max-new-tokens", "30"],
                              capture_output=True, text=True)
        check(want.returncode == 0, "%s: sample: %s" % (name, want.stderr))
        want = want.stdout.rstrip("\n")

        Files.asked = []
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Files, directory=page))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        origin = "http://127.0.0.1:%d" % server.server_address[1]
        try:
            driver.get(origin + "/")
            end = time.time() + 60
            while driver.execute_script("return document.body.dataset.state") == "loading" and time.time() < end:
                time.sleep(0.1)
            state = driver.execute_script("return document.body.dataset.state")
            check(state == "ready", "%s: the page is %s: %s" % (name, state, driver.find_element(By.ID, "status").text))
            box = driver.find_element(By.ID, "prompt")
            box.clear()
            box.send_keys(prompt)
            tokens = driver.find_element(By.ID, "tokens")
            tokens.clear()
            tokens.send_keys("30")
            check(driver.find_element(By.ID, "greedy").is_selected(), "greedy is not the page's default")
            driver.find_element(By.ID, "go").click()
            end = time.time() + 120
            while driver.execute_script("return document.body.dataset.state") in ("ready", "running") and \
                    time.time() < end:
                time.sleep(0.1)
            state = driver.execute_script("return document.body.dataset.state")
            check(state == "done", "%s: generation is %s: %s" % (name, state, driver.find_element(By.ID, "status").text))
            got = driver.execute_script("return document.getElementById('output').textContent")
            check(got == want, "%s: the page generated %r, tinylm sample --greedy %r" % (name, got, want))
            # The newest token's attention: one weight per position it saw, summing to 1.
            weights = driver.execute_script(
                "return Array.from(document.querySelectorAll('#weights .token'), s => Number(s.title.split(' ')[1]))")
            check(len(weights) >= 2 and abs(sum(weights) - 1) < 0.01, "%s: the attention shown: %r" % (name, weights))
            speeds.append((name, float(driver.execute_script("return document.body.dataset.tokensPerSecond"))))
            errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
            check(not errors, "%s: the page logged errors: %r" % (name, errors))
            outside = driver.execute_script(
                "return performance.getEntriesByType('resource').map(e => e.name).filter(n => !n.startsWith(arguments[0]))",
                origin)
            check(not outside, "%s: the page asked for %r" % (name, outside))
            unknown = sorted({p for p in Files.asked if p.lstrip("/") not in files + [""] and p != "/favicon.ico"})
            check(not unknown, "%s: the page asked the server for %r" % (name, unknown))
            print("ok   %s: the page generates tinylm sample --greedy's 30 tokens (%.0f tokens/s in headless Chromium); "
                  "files asked: %s" % (name, speeds[-1][1], ", ".join(sorted(set(Files.asked)))))
        finally:
            server.shutdown()
            server.server_close()
    driver.save_screenshot(os.path.join(work, "web.png"))
finally:
    driver.quit()
print("ok: 2 pages (bytes and ids) generate tinylm's greedy text in a browser, with nothing from elsewhere; "
      "refusals checked; tokens/s %s" % ", ".join("%s %.0f" % s for s in speeds))
