// tinylm's model in a web page: model.onnx (the graph with the KV cache, written by
// `tinylm export --format web`) run by ONNX Runtime Web (WebAssembly, one thread), a token
// at a time as `tinylm sample` decodes: on the cache while it holds fewer positions than
// the context, then the last C tokens read afresh. model.json says the model's sizes and
// its tokenizer (bytes of UTF-8 text, or token ids). Nothing is fetched from elsewhere.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const state = (s) => { document.body.dataset.state = s; };
  const say = (text, error) => {
    $("status").textContent = text;
    $("status").className = error ? "error" : "muted";
  };
  let info = null, session = null, tok = null, stopping = false;
  let shown = null;  // the last call's outputs and the tokens it saw, for the attention view

  function tokenizer(kind, vocab) {
    if (kind === "byte") {
      return {
        encode: (text) => Array.from(new TextEncoder().encode(text)),
        decode: (ids) => new TextDecoder().decode(Uint8Array.from(ids)),
        piece: (id) => new TextDecoder().decode(Uint8Array.of(id)),
      };
    }
    return {  // ids: integers in [0, V) separated by spaces or commas, as tinylm reads them
      encode: (text) => text.split(/[\s,]+/).filter((w) => w.length > 0).map((w) => {
        if (!/^\d+$/.test(w) || Number(w) >= vocab)
          throw new Error(`'${w}' is not a token id: this model takes integers in [0, ${vocab}) separated by spaces or commas`);
        return Number(w);
      }),
      decode: (ids) => ids.join(" "),
      piece: (id) => String(id),
    };
  }

  // The next token from the last position's logits: the most likely (the first of equals,
  // as argmax), or drawn after temperature, top-k and top-p as tinylm applies them.
  function pick(logits, o) {
    const V = logits.length;
    if (o.greedy) {
      let best = 0;
      for (let i = 1; i < V; ++i) if (logits[i] > logits[best]) best = i;
      return best;
    }
    let max = -Infinity;
    for (let i = 0; i < V; ++i) max = Math.max(max, logits[i]);
    let l = Array.from(logits, (x) => (x - max) / o.temperature);
    if (o.topK > 0 && o.topK < V) {
      const kth = l.slice().sort((a, b) => b - a)[o.topK - 1];
      l = l.map((x) => (x < kth ? -Infinity : x));
    }
    let p = l.map(Math.exp);
    let sum = p.reduce((a, b) => a + b, 0);
    p = p.map((x) => x / sum);
    if (o.topP < 1) {  // drop a token when those ranked above it already reach top-p
      const order = p.map((_, i) => i).sort((a, b) => p[b] - p[a]);
      let before = 0;
      for (const i of order) {
        const drop = before >= o.topP;
        before += p[i];
        if (drop) p[i] = 0;
      }
      sum = p.reduce((a, b) => a + b, 0);
      p = p.map((x) => x / sum);
    }
    let r = Math.random(), last = 0;
    for (let i = 0; i < V; ++i) {
      if (p[i] > 0) last = i;
      r -= p[i];
      if (r < 0) return i;
    }
    return last;
  }

  function emptyCache() {
    const feeds = {};
    for (const c of info.caches) {
      feeds[c.key] = new ort.Tensor("float32", new Float32Array(0), [1, c.kv_heads, 0, c.d_head]);
      feeds[c.value] = new ort.Tensor("float32", new Float32Array(0), [1, c.kv_heads, 0, c.d_head]);
    }
    return feeds;
  }

  // One call of the graph: ids (the new tokens) on `cache` (null: an empty past).
  async function step(ids, cache) {
    const feeds = Object.assign({ input_ids: new ort.Tensor("int64", BigInt64Array.from(ids, (x) => BigInt(x)), [1, ids.length]) },
                                cache || emptyCache());
    const out = await session.run(feeds);
    const [, T, V] = out.logits.dims;
    const next = {};
    for (const c of info.caches) {
      next[c.key] = out[c.present_key];
      next[c.value] = out[c.present_value];
    }
    return { last: out.logits.data.subarray((T - 1) * V, T * V), cache: next, out, seen: next[info.caches[0].key].dims[2] };
  }

  // What the newest token of `positions` (the tokens the last call saw) looked at.
  function showAttention(out, positions) {
    shown = { out, positions };
    const layer = Number($("layer").value), head = $("head").value;
    const a = out["attentions." + layer];
    if (!a) return;
    const [, H, T, S] = a.dims;
    const w = new Float32Array(S);
    for (let h = 0; h < H; ++h) {
      if (head !== "mean" && Number(head) !== h) continue;
      const row = (h * T + (T - 1)) * S;
      for (let j = 0; j < S; ++j) w[j] += a.data[row + j] / (head === "mean" ? H : 1);
    }
    const top = Math.max(...w, 1e-9);
    const box = $("weights");
    box.replaceChildren();
    positions.forEach((id, j) => {
      const span = document.createElement("span");
      span.className = "token";
      span.textContent = tok.piece(id);
      span.title = `weight ${w[j].toFixed(3)}`;
      span.style.background = `rgba(47, 111, 223, ${(w[j] / top).toFixed(3)})`;
      span.style.color = w[j] / top > 0.55 ? "#fff" : "";
      box.appendChild(span);
    });
  }

  async function generate(prompt, o) {
    const C = info.context_length;
    const seq = prompt.slice();
    const start = performance.now();
    let painted = start;
    let r = await step(seq.slice(-C), null);
    let last = null;
    for (let i = 0; i < o.tokens && !stopping; ++i) {
      last = { out: r.out, positions: seq.slice(seq.length - r.seen) };
      seq.push(pick(r.last, o));
      if (performance.now() - painted > 50) {  // let the page show the text so far
        $("output").textContent = tok.decode(seq);
        showAttention(last.out, last.positions);
        await new Promise((resolve) => setTimeout(resolve, 0));
        painted = performance.now();
      }
      if (i === o.tokens - 1) break;
      r = r.seen < C ? await step(seq.slice(-1), r.cache) : await step(seq.slice(-C), null);
    }
    const seconds = (performance.now() - start) / 1000;
    $("output").textContent = tok.decode(seq);
    if (last) showAttention(last.out, last.positions);
    return { made: seq.length - prompt.length, seconds };
  }

  function options() {
    const number = (id) => Number($(id).value);
    const o = { tokens: Math.floor(number("tokens")), greedy: $("greedy").checked, temperature: number("temperature"),
                topK: Math.floor(number("top-k")), topP: number("top-p") };
    if (!(o.tokens >= 1)) throw new Error("tokens must be at least 1");
    if (!o.greedy && !(o.temperature > 0)) throw new Error("temperature must be > 0 (or tick greedy)");
    if (!(o.topK >= 0)) throw new Error("top-k must be >= 0 (0 = off)");
    if (!(o.topP > 0 && o.topP <= 1)) throw new Error("top-p must be in (0, 1]");
    return o;
  }

  $("form").addEventListener("submit", async (event) => {
    event.preventDefault();
    let prompt, o;
    try {
      o = options();
      prompt = tok.encode($("prompt").value);
      if (prompt.length === 0) throw new Error("the prompt is empty");
    } catch (e) {
      say(e.message, true);
      return;
    }
    $("go").disabled = true;
    $("stop").disabled = false;
    stopping = false;
    state("running");
    say("Generating…");
    try {
      const { made, seconds } = await generate(prompt, o);
      document.body.dataset.tokensPerSecond = (made / seconds).toFixed(1);
      say(`${made} tokens in ${seconds.toFixed(2)} s: ${(made / seconds).toFixed(1)} tokens/s, in this browser`);
      state("done");
    } catch (e) {
      say("Generation failed: " + e.message, true);
      console.error(e);
      state("error");
    }
    $("go").disabled = false;
    $("stop").disabled = true;
  });
  $("stop").addEventListener("click", () => { stopping = true; });
  for (const id of ["layer", "head"])
    $(id).addEventListener("change", () => { if (shown) showAttention(shown.out, shown.positions); });

  (async function load() {
    try {
      const reply = await fetch("model.json");
      if (!reply.ok) throw new Error(`model.json: HTTP ${reply.status}`);
      info = await reply.json();
      tok = tokenizer(info.tokenizer, info.vocab_size);
      ort.env.wasm.numThreads = 1;  // no cross-origin isolation needed
      ort.env.wasm.wasmPaths = new URL(".", location.href).href;
      session = await ort.InferenceSession.create("model.onnx", { executionProviders: ["wasm"] });
      for (let l = 0; l < info.caches.length; ++l) $("layer").add(new Option(String(l), String(l)));
      $("layer").value = String(info.caches.length - 1);
      $("head").add(new Option("mean", "mean"));
      for (let h = 0; h < info.heads; ++h) $("head").add(new Option(String(h), String(h)));
      $("model").textContent = `${info.kind}, step ${info.step}, context ${info.context_length}, ` +
                               `vocabulary ${info.vocab_size} (${info.tokenizer === "byte" ? "UTF-8 bytes" : "token ids"})`;
      $("prompt").value = info.tokenizer === "byte" ? "Once upon a time" : "1 2 3";
      $("go").disabled = false;
      say("Ready: type a prompt and generate.");
      state("ready");
    } catch (e) {
      say("Could not load the model: " + e.message + " (serve this folder over HTTP: python3 -m http.server)", true);
      console.error(e);
      state("error");
    }
  })();
})();
