"""What the `tinylm serve` tests share: a trained checkpoint, a server started on a free
port (and stopped), and raw HTTP helpers (Python's standard library only); and headless
Chromium for the tests of pages (tests/serve/test_browser.py, tests/web/)."""
import atexit
import ctypes
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def chromium(work, window="1300,1100"):
    """Headless Chromium driven by chromium-driver through Selenium, with the page's console
    kept (driver.get_log("browser")); exits 77 (skipped), saying what to install, where one
    of them is missing."""
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        print("SKIPPED: python3-selenium is not installed (scripts/setup.sh --test installs it)")
        sys.exit(77)
    browser = shutil.which("chromium")
    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not browser or not os.path.exists(driver_path):
        print("SKIPPED: chromium and chromium-driver are not installed (scripts/setup.sh --test installs them)")
        sys.exit(77)
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=" + window, "--user-data-dir=" + os.path.join(work, "profile")):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver_path), options=options)


def train(tinylm, work, name="run", *flags):
    """Trains the reference run (a few seconds) into work/name; returns its directory."""
    out = os.path.join(work, name)
    if not os.path.exists(os.path.join(out, "metrics.jsonl")):
        r = subprocess.run([tinylm, "train", "--out-dir", out, *flags], capture_output=True, text=True)
        check(r.returncode == 0, "training failed:\n" + r.stdout + r.stderr)
    return out


def fresh_run(tinylm, work):
    """An empty scratch directory `work` (what an earlier run left is removed) holding the
    reference run; returns the run's directory."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    return train(tinylm, work)


started = []


@atexit.register
def _kill_servers():
    """A test that fails leaves no server behind."""
    for proc in started:
        if proc.poll() is None:
            proc.kill()


def _die_with_parent():
    ctypes.CDLL("libc.so.6").prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: killed if the test is


class Server:
    """`tinylm serve CHECKPOINT --port 0 ARGS...`, its port read from its first line."""

    def __init__(self, tinylm, checkpoint, *args, work="."):
        self.log = open(os.path.join(work, "serve.log"), "a+")
        self.proc = subprocess.Popen([tinylm, "serve", checkpoint, "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     preexec_fn=_die_with_parent)
        started.append(self.proc)
        line = self.proc.stdout.readline()
        m = re.search(r"http://\[?([^\]/]+?)\]?:(\d+)/", line)
        if not m:
            self.proc.kill()
            self.log.seek(0)
            fail("serve did not start: " + line + self.log.read()[-2000:])
        self.host, self.port = m.group(1), int(m.group(2))

    def request(self, method, path, body=None, headers=None, timeout=30):
        """(status, headers, parsed JSON or raw text)"""
        c = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
        h = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            h.setdefault("Content-Type", "application/json")
        c.request(method, path, body=body, headers=h)
        r = c.getresponse()
        data = r.read().decode("utf-8", "replace")
        c.close()
        try:
            data = json.loads(data)
        except ValueError:
            pass
        return r.status, {k.lower(): v for k, v in r.getheaders()}, data

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def raw(self, data, timeout=10, pause_after=None):
        """Sends bytes on a fresh connection and returns what comes back until it closes."""
        s = socket.create_connection((self.host, self.port), timeout=timeout)
        s.sendall(data)
        out = b""
        try:
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except (socket.timeout, ConnectionResetError):
            pass
        s.close()
        return out.decode("utf-8", "replace")

    def health(self):
        return self.request("GET", "/health")[2]

    def stop(self, timeout=20):
        """SIGTERM; returns the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            fail("serve did not exit within %d s of SIGTERM" % timeout)

    def rss_kib(self):
        with open("/proc/%d/status" % self.proc.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0


def sse_events(response_text):
    """The data fields of a server-sent event stream, in order."""
    return [e[len("data: "):] for e in response_text.split("\n\n") if e.startswith("data: ")]


def wait_for(predicate, seconds, what):
    end = time.time() + seconds
    while time.time() < end:
        if predicate():
            return
        time.sleep(0.02)
    fail("timed out after %g s waiting for %s" % (seconds, what))
