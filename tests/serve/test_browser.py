#!/usr/bin/env python3
"""The explorer page in a real browser: headless Chromium, driven by chromium-driver through
Selenium, loads the page from a running `tinylm serve`, types a prompt, and checks the
heatmap grid (layers x heads cells whose rows, read from the page, sum to 1), the
highlighting of a hovered token, streamed generation, the loss curve and the model card;
then writes a screenshot.
usage: test_browser.py path/to/tinylm scratch-dir [SCREENSHOT.png]
Exits 77 (skipped) where Chromium, its driver or Selenium is not installed."""
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from serving import Server, check, chromium, fail, train  # noqa: E402

tinylm, work = sys.argv[1], sys.argv[2]
screenshot = sys.argv[3] if len(sys.argv) > 3 else os.path.join(work, "explorer.png")
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)

# A transformer with 2 layers x 2 heads on bytes: a grid of more than one cell each way.
text_file = os.path.join(work, "text.txt")
with open(text_file, "w") as f:
    f.write("the cat sat on the mat. the dog sat on the log. " * 300)
run = train(tinylm, work, "run", "--task", "text", "--data", text_file, "--vocab-size", "256", "--model",
            "transformer", "--n-layers", "2", "--d-model", "32", "--n-heads", "2", "--context-length", "64",
            "--seq-len", "64", "--epochs", "2", "--steps-per-epoch", "40", "--log-every", "5")
srv = Server(tinylm, run, work=work)
driver = chromium(work, "1400,1500")  # (or skipped, saying what is missing)
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
driver.set_script_timeout(30)


def wait(js, seconds, what):
    """Waits until the script returns something truthy; returns it."""
    end = time.time() + seconds
    while time.time() < end:
        value = driver.execute_script(js)
        if value:
            return value
        time.sleep(0.05)
    fail("timed out after %g s waiting for %s" % (seconds, what))


try:
    driver.get("http://%s:%d/" % (srv.host, srv.port))
    wait("return document.querySelectorAll('.heatmap').length > 0", 30, "the first heatmaps")
    check("step-00000080" in driver.find_element(By.ID, "model-name").text, "the model name is not shown")

    # Type a prompt, press Enter: the tokens and a layers x heads grid of heatmaps.
    prompt = driver.find_element(By.ID, "prompt")
    prompt.clear()
    prompt.send_keys("the dog sat on")
    prompt.send_keys(Keys.ENTER)
    T = len("the dog sat on")
    wait("return document.querySelectorAll('#tokens .token').length == %d" % T, 30, "the prompt's %d tokens" % T)
    cells = driver.find_elements(By.CSS_SELECTOR, ".heatmap")
    check(len(cells) == 2 * 2, "%d heatmap cells, expected 2 layers x 2 heads" % len(cells))
    seen = set()
    for cell in cells:
        l, h = int(cell.get_attribute("data-layer")), int(cell.get_attribute("data-head"))
        seen.add((l, h))
        rows = json.loads(cell.get_attribute("data-weights"))
        check(len(rows) == T and all(len(r) == T for r in rows), "cell %d,%d is not %d x %d" % (l, h, T, T))
        for i, r in enumerate(rows):
            check(abs(sum(r) - 1) < 1e-3, "cell %d,%d row %d sums to %g" % (l, h, i, sum(r)))
            check(max(r[i + 1:], default=0) < 1e-6, "cell %d,%d row %d attends to the future" % (l, h, i))
        check(cell.size["width"] > 50 and cell.size["height"] > 50, "cell %d,%d is not drawn at a visible size" % (l, h))
    check(seen == {(0, 0), (0, 1), (1, 0), (1, 1)}, "cells: %r" % sorted(seen))
    nexts = driver.find_elements(By.CSS_SELECTOR, "#next .bar")
    check(len(nexts) == 10, "%d next-token bars" % len(nexts))

    # Hovering a token shades the tokens it attends to (the selected head's row).
    tokens = driver.find_elements(By.CSS_SELECTOR, "#tokens .token")
    ActionChains(driver).move_to_element(tokens[5]).perform()
    shaded = wait("return Array.from(document.querySelectorAll('#tokens .token')).map(t => t.style.background)"
                  ".filter(b => b.startsWith('rgba')).length", 5, "hover shading")
    check(shaded == T, "hovering token 5 shaded %d of %d tokens" % (shaded, T))

    # One click enlarges a head.
    cells[3].click()
    wait("return !document.getElementById('zoom').hidden", 5, "the enlarged heatmap")
    check("layer 1, head 1" in driver.find_element(By.ID, "zoom-title").text, "the enlarged view's title")
    driver.find_element(By.ID, "zoom-close").click()

    # Generation streams: the text arrives in more than one event (at most one a millisecond,
    # docs/serve.md), and what the page shows is what the same request gets unstreamed.
    driver.execute_script("document.getElementById('max-tokens').value = 200; document.getElementById('seed').value = 1;")
    driver.find_element(By.ID, "generate").click()
    wait("return document.getElementById('output').dataset.done == 'true'", 60, "the stream's end")
    chunks = int(driver.find_element(By.ID, "output").get_attribute("data-chunks"))
    completion = driver.execute_script("return document.querySelector('#output .completion').textContent")
    sent = driver.execute_script("""const v = id => Number(document.getElementById(id).value);
        return {prompt: document.getElementById('prompt').value, max_tokens: v('max-tokens'), seed: v('seed'),
                temperature: v('temperature'), top_k: v('top-k'), top_p: v('top-p')};""")
    status, _, alone = srv.post("/v1/completions", sent)
    check(status == 200, "the unstreamed completion: %d %r" % (status, alone))
    check(completion == alone["choices"][0]["text"],
          "the page shows %r, the same request unstreamed gets %r" % (completion, alone["choices"][0]["text"]))
    check(chunks >= 2 and len(completion) > 0, "%d stream events, completion %r" % (chunks, completion))

    # The loss curve is drawn from the run's metrics (train and validation points), with ink.
    points = int(wait("return document.getElementById('chart-loss').dataset.points", 30, "the loss curve"))
    with open(os.path.join(run, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f if line.strip()]
    expected = sum(1 for r in records if r["type"] in ("train", "eval"))
    check(points == expected, "the loss chart has %d points, the metrics %d" % (points, expected))
    ink = driver.execute_script("""
        const c = document.getElementById('chart-loss');
        const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
        let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n;""")
    check(ink > 500, "the loss chart has %d inked pixels" % ink)

    # The model card: the parameter table matches the checkpoint's.
    rows = driver.find_elements(By.CSS_SELECTOR, "#parameters tr")
    status, _, models = srv.request("GET", "/v1/models")
    check(len(rows) == 1 + len(models["data"][0]["card"]["parameters"]), "%d parameter rows" % len(rows))

    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    check(not errors, "the page logged errors: %r" % errors)
    driver.execute_script("window.scrollTo(0, 0)")
    driver.save_screenshot(screenshot)
    check(os.path.getsize(screenshot) > 10000, "the screenshot is too small")
finally:
    driver.quit()
check(srv.stop() == 0, "serve's exit status")
print("ok: %d x %d heatmaps with rows summing to 1, hover, zoom, %d streamed events, %d loss points; screenshot %s"
      % (2, 2, chunks, points, screenshot))
