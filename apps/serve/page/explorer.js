// The tinylm explorer: a prompt's tokens, next-token distribution and every layer x head's
// attention; streamed generation; the run's curves; the model card. Talks only to the
// server that served it (/v1/...); nothing is fetched from elsewhere.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { model: null, attention: null, selected: [0, 0], abort: null };

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const key = $("api-key").value;
  if (key) h["Authorization"] = "Bearer " + key;
  return h;
}

async function api(path, body) {
  const response = await fetch(path, body === undefined ? { headers: headers(false) }
    : { method: "POST", headers: headers(true), body: JSON.stringify(body) });
  if (response.status === 401) $("key-box").hidden = false;
  const data = await response.json();
  if (!response.ok) throw new Error(data.error ? data.error.message : response.statusText);
  return data;
}

function status(text, error) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "muted";
}

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// A token's text made visible: spaces as a middle dot, newlines and tabs as arrows.
function visible(text) {
  return text.replace(/ /g, "\u00b7").replace(/\n/g, "\u21b5").replace(/\t/g, "\u2192") || "\u2205";
}

// ---- the model card ------------------------------------------------------------------

async function loadModel() {
  const list = await api("/v1/models");
  const m = list.data[0];
  state.model = m;
  $("model-name").textContent = m.id;
  document.title = "tinylm explorer: " + m.id;
  const c = m.card;
  const kind = c.tokenizer ? c.tokenizer.kind : "ids";
  if (!$("prompt").value) $("prompt").value = kind === "ids" || !c.tokenizer ? "3 14 15 9 26 5" : "Once upon a time";
  const card = $("card");
  card.replaceChildren();
  const facts = el("table");
  const rows = [
    ["model", c.model.kind + " (version " + c.model.version + ")"],
    ...Object.entries(c.model.options).map(([k, v]) => ["  " + k, v]),
    ["parameters", Number(c.parameter_count).toLocaleString("en")],
    ["context", c.context_length], ["vocabulary", c.vocab_size],
    ["tokenizer", c.tokenizer_description],
    ["trained", c.step + " steps, best validation loss " + (c.best_val_loss === null ? "none" : c.best_val_loss.toFixed(6))],
    ["checkpoint", c.path + " (" + Number(c.bytes).toLocaleString("en") + " bytes, format " + c.format_version + ")"],
    ["device", c.device],
  ];
  for (const [k, v] of rows) { const tr = el("tr"); tr.append(el("th", {}, k), el("td", {}, String(v))); facts.append(tr); }
  const params = el("table", { id: "parameters" });
  const head = el("tr");
  for (const h of ["parameter", "shape", "count"]) head.append(el("th", {}, h));
  params.append(head);
  for (const p of c.parameters) {
    const tr = el("tr");
    tr.append(el("td", {}, p.name), el("td", {}, "[" + p.shape.join(", ") + "]"),
              el("td", { class: "num" }, Number(p.count).toLocaleString("en")));
    params.append(tr);
  }
  card.append(facts, el("h3", {}, "Parameters"), params);
}

// ---- attention -------------------------------------------------------------------------

// White (0) to blue (the matrix's largest weight).
function drawHeatmap(canvas, rows, scale) {
  const T = rows.length;
  canvas.width = T * scale;
  canvas.height = T * scale;
  const ctx = canvas.getContext("2d");
  let max = 0;
  for (const r of rows) for (const w of r) max = Math.max(max, w);
  for (let i = 0; i < T; i++) {
    for (let j = 0; j < T; j++) {
      const v = max > 0 ? rows[i][j] / max : 0;
      ctx.fillStyle = `rgb(${Math.round(255 - 208 * v)},${Math.round(255 - 144 * v)},${Math.round(255 - 32 * v)})`;
      ctx.fillRect(j * scale, i * scale, scale, scale);
    }
  }
}

async function analyze() {
  status("analyzing…");
  try {
    const a = await api("/v1/attention", { prompt: $("prompt").value, top_k: 10 });
    state.attention = a;
    if (state.selected[0] >= a.layers || state.selected[1] >= a.heads) state.selected = [0, 0];
    renderTokens();
    renderNext(a.next);
    renderGrid();
    status("");
  } catch (e) {
    status(e.message, true);
  }
}

function renderTokens() {
  const box = $("tokens");
  box.replaceChildren();
  state.attention.tokens.forEach((t, i) => {
    const span = el("span", { class: "token", "data-index": i, title: "id " + t.id }, visible(t.text));
    span.addEventListener("mouseenter", () => highlight(i));
    span.addEventListener("mouseleave", () => highlight(-1));
    box.append(span);
  });
}

// Shades every token by the weight token i gives it in the selected head (bertviz's head view).
function highlight(i) {
  const spans = $("tokens").children;
  const [l, h] = state.selected;
  const row = i >= 0 ? state.attention.attention[l][h][i] : null;
  for (let j = 0; j < spans.length; j++) {
    spans[j].classList.toggle("focus", j === i);
    spans[j].style.background = row ? `rgba(47,111,223,${row[j].toFixed(3)})` : "";
  }
}

function renderNext(next) {
  const box = $("next");
  box.replaceChildren();
  for (const n of next) {
    const bar = el("div", { class: "bar" });
    bar.style.width = (100 * n.prob).toFixed(1) + "%";
    box.append(el("span", { title: "id " + n.id }, visible(n.text)), bar, el("span", {}, (100 * n.prob).toFixed(2) + "%"));
  }
}

function renderGrid() {
  const a = state.attention;
  const grid = $("grid");
  grid.replaceChildren();
  grid.style.gridTemplateColumns = `max-content repeat(${a.heads}, max-content)`;
  $("attention-shape").textContent = `${a.layers} layer(s) x ${a.heads} head(s), ${a.tokens.length} tokens`;
  grid.append(el("span"));
  for (let h = 0; h < a.heads; h++) grid.append(el("span", { class: "cell" }, "head " + h));
  for (let l = 0; l < a.layers; l++) {
    grid.append(el("span", { class: "cell" }, "layer " + l));
    for (let h = 0; h < a.heads; h++) {
      const canvas = el("canvas", { class: "heatmap", "data-layer": l, "data-head": h,
                                    title: `layer ${l}, head ${h}: rows are queries, columns keys` });
      canvas.dataset.weights = JSON.stringify(a.attention[l][h]);
      drawHeatmap(canvas, a.attention[l][h], 1);
      canvas.classList.toggle("selected", l === state.selected[0] && h === state.selected[1]);
      canvas.addEventListener("click", () => { select(l, h); zoom(l, h); });
      grid.append(canvas);
    }
  }
}

function select(l, h) {
  state.selected = [l, h];
  for (const c of document.querySelectorAll(".heatmap"))
    c.classList.toggle("selected", Number(c.dataset.layer) === l && Number(c.dataset.head) === h);
}

function zoom(l, h) {
  const a = state.attention;
  const T = a.tokens.length;
  const canvas = $("zoom-canvas");
  const cell = Math.max(8, Math.min(40, Math.floor(560 / T)));
  const margin = 90;
  canvas.width = margin + T * cell;
  canvas.height = margin + T * cell;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  const heat = document.createElement("canvas");
  drawHeatmap(heat, a.attention[l][h], cell);
  ctx.drawImage(heat, margin, margin);
  ctx.fillStyle = "#1d2330";
  ctx.font = Math.min(12, cell) + "px monospace";
  ctx.textBaseline = "middle";
  for (let i = 0; i < T; i++) {
    const label = visible(a.tokens[i].text).slice(0, 10);
    ctx.textAlign = "right";
    ctx.fillText(label, margin - 4, margin + (i + 0.5) * cell);
    ctx.save();
    ctx.translate(margin + (i + 0.5) * cell, margin - 4);
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    ctx.fillText(label, 0, 0);
    ctx.restore();
  }
  $("zoom-title").textContent = `layer ${l}, head ${h} (rows: queries, columns: keys)`;
  $("zoom").hidden = false;
}

// ---- generation ------------------------------------------------------------------------

async function generate() {
  const out = $("output");
  out.replaceChildren(el("span", { class: "prompt" }, $("prompt").value));
  out.dataset.chunks = "0";
  out.dataset.done = "false";
  const body = {
    model: state.model.id, prompt: $("prompt").value, stream: true,
    max_tokens: Number($("max-tokens").value), temperature: Number($("temperature").value),
    top_k: Number($("top-k").value), top_p: Number($("top-p").value),
  };
  if ($("seed").value !== "") body.seed = Number($("seed").value);
  state.abort = new AbortController();
  $("generate").disabled = true;
  $("stop").disabled = false;
  const text = el("span", { class: "completion" });
  out.append(text);
  try {
    const response = await fetch("/v1/completions", { method: "POST", headers: headers(true),
                                                      body: JSON.stringify(body), signal: state.abort.signal });
    if (!response.ok) {
      if (response.status === 401) $("key-box").hidden = false;
      const e = await response.json();
      throw new Error(e.error ? e.error.message : response.statusText);
    }
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, end);
        buffer = buffer.slice(end + 2);
        if (!event.startsWith("data: ")) continue;
        const data = event.slice(6);
        if (data === "[DONE]") { out.dataset.done = "true"; continue; }
        const chunk = JSON.parse(data);
        if (chunk.choices.length && chunk.choices[0].text) {
          text.textContent += chunk.choices[0].text;
          out.dataset.chunks = String(Number(out.dataset.chunks) + 1);
        }
        if (chunk.choices.length && chunk.choices[0].finish_reason) status("finished: " + chunk.choices[0].finish_reason);
      }
    }
  } catch (e) {
    if (e.name !== "AbortError") status(e.message, true);
  } finally {
    $("generate").disabled = false;
    $("stop").disabled = true;
  }
}

// ---- the run's curves ------------------------------------------------------------------

// series: [{label, color, points: [[x, y], ...]}]; a log scale for y when asked.
function drawChart(canvas, series, log) {
  const ctx = canvas.getContext("2d");
  const W = canvas.width, H = canvas.height, left = 56, right = 10, top = 10, bottom = 28;
  ctx.clearRect(0, 0, W, H);
  const all = series.flatMap((s) => s.points).filter((p) => Number.isFinite(p[1]) && (!log || p[1] > 0));
  canvas.dataset.points = String(all.length);
  ctx.font = "11px sans-serif";
  ctx.fillStyle = "#6b7385";
  if (!all.length) { ctx.fillText("no data yet", W / 2 - 30, H / 2); return; }
  const fy = (y) => (log ? Math.log10(y) : y);
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]));
  let y0 = Math.min(...all.map((p) => fy(p[1]))), y1 = Math.max(...all.map((p) => fy(p[1])));
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { const pad = Math.abs(y0) * 0.1 || 0.5; y0 -= pad; y1 += pad; }
  const X = (x) => left + ((x - x0) / (x1 - x0)) * (W - left - right);
  const Y = (y) => top + (1 - (fy(y) - y0) / (y1 - y0)) * (H - top - bottom);
  ctx.strokeStyle = "#d9dde5";
  ctx.beginPath();
  ctx.moveTo(left, top); ctx.lineTo(left, H - bottom); ctx.lineTo(W - right, H - bottom);
  ctx.stroke();
  for (let k = 0; k <= 4; k++) {
    const v = y0 + ((y1 - y0) * k) / 4;
    const label = log ? Number(Math.pow(10, v).toPrecision(2)).toString() : Number(v.toPrecision(3)).toString();
    ctx.fillText(label, 4, top + (1 - k / 4) * (H - top - bottom) + 4);
  }
  ctx.fillText("step " + x0, left, H - 8);
  ctx.fillText(String(x1), W - right - 30, H - 8);
  series.forEach((s, n) => {
    ctx.strokeStyle = s.color;
    ctx.fillStyle = s.color;
    ctx.lineWidth = 1.5;
    ctx.beginPath();
    s.points.filter((p) => Number.isFinite(p[1]) && (!log || p[1] > 0)).forEach((p, i) => {
      if (i) ctx.lineTo(X(p[0]), Y(p[1])); else ctx.moveTo(X(p[0]), Y(p[1]));
    });
    ctx.stroke();
    ctx.fillText(s.label, W - right - 90, top + 12 + 13 * n);
  });
}

async function loadMetrics() {
  let m;
  try {
    m = await api("/v1/metrics");
  } catch (e) {
    $("run-state").textContent = e.message;
    return;
  }
  const train = m.records.filter((r) => r.type === "train");
  const evals = m.records.filter((r) => r.type === "eval");
  drawChart($("chart-loss"), [
    { label: "train", color: "#2f6fdf", points: train.map((r) => [r.step, r.loss]) },
    { label: "validation", color: "#d2691e", points: evals.map((r) => [r.step, r.loss]) },
  ], true);
  drawChart($("chart-accuracy"), [{ label: "accuracy", color: "#2e8b57", points: evals.map((r) => [r.step, r.accuracy]) }], false);
  drawChart($("chart-lr"), [{ label: "lr", color: "#8a2be2", points: train.map((r) => [r.step, r.lr]) }], false);
  drawChart($("chart-speed"), [{ label: "tokens/s", color: "#555", points: train.map((r) => [r.step, r.tokens_per_s]) }], false);
  const live = m.seconds_since_update !== null && m.seconds_since_update < 120;
  $("run-state").textContent = m.path === null ? "no metrics.jsonl beside this checkpoint"
    : `${m.records.length} records from ${m.path}` + (live ? " (live: updated " + m.seconds_since_update.toFixed(0) + " s ago)" : "");
  if (live) setTimeout(loadMetrics, 3000);
}

// ---- start -----------------------------------------------------------------------------

window.addEventListener("DOMContentLoaded", async () => {
  $("analyze").addEventListener("click", analyze);
  $("generate").addEventListener("click", generate);
  $("stop").addEventListener("click", () => state.abort && state.abort.abort());
  $("zoom-close").addEventListener("click", () => { $("zoom").hidden = true; });
  $("zoom").addEventListener("click", (e) => { if (e.target === $("zoom")) $("zoom").hidden = true; });
  $("api-key").addEventListener("change", start);
  $("prompt").addEventListener("keydown", (e) => { if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); analyze(); } });
  await start();
});

async function start() {
  try {
    await loadModel();
    status("");
    await Promise.all([analyze(), loadMetrics()]);
  } catch (e) {
    status(e.message, true);
  }
}
