"use strict";
// Explain: the cross-attention of one sentence (POST attention), drawn as a heatmap by layer and head, with the
// weight of the cell under the pointer read out. The colour scale is matplotlib's viridis, as `nanomt plot`.

const Attention = (() => {
  const VIRIDIS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
                   [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]];
  const FONT = '13px ui-monospace, "SFMono-Regular", "DejaVu Sans Mono", Menlo, Consolas, monospace';
  let result = null;  // the last attention answer
  let layout = null;  // where its cells are drawn, for the read-out
  let pending = null; // the request in flight

  function viridis(v) {
    const x = Math.min(Math.max(v, 0), 1) * (VIRIDIS.length - 1);
    const i = Math.min(Math.floor(x), VIRIDIS.length - 2), t = x - i;
    const c = VIRIDIS[i].map((a, k) => Math.round(a + t * (VIRIDIS[i + 1][k] - a)));
    return `rgb(${c[0]},${c[1]},${c[2]})`;
  }

  function fillSelect(select, options) {
    const old = select.value;
    select.replaceChildren(...options.map(([value, text]) => new Option(text, value)));
    select.value = options.some(([v]) => String(v) === old) ? old : String(options[options.length - 1][0]);
    select.disabled = false;
  }

  // The (T, S) matrix shown: one head, or the mean of the layer's heads.
  function matrix() {
    const layer = result.cross_attention[Number($("layer").value)];
    if ($("head").value !== "avg") return layer[Number($("head").value)];
    return layer[0].map((row, t) => row.map((_, s) => layer.reduce((sum, h) => sum + h[t][s], 0) / layer.length));
  }

  function draw() {
    const canvas = $("heatmap");
    if (!result || !canvas.offsetParent) return;
    const style = getComputedStyle(document.body);
    const fg = style.getPropertyValue("--fg"), muted = style.getPropertyValue("--muted");
    const bg = style.getPropertyValue("--card");
    const src = result.src_tokens, tgt = result.tgt_tokens, m = matrix();
    const ctx = canvas.getContext("2d");
    ctx.font = FONT;
    const widest = (tokens) => Math.max(0, ...tokens.map((t) => ctx.measureText(t).width));
    const avail = canvas.parentElement.clientWidth - 20;
    const cell = Math.max(16, Math.min(40, Math.floor((avail - widest(tgt) - 70) / Math.max(src.length, 1))));
    const rotate = widest(src) > cell - 4;  // source labels above the columns, slanted when they do not fit
    const left = Math.ceil(Math.max(widest(tgt), ctx.measureText("source →").width)) + 14;
    const top = Math.max(rotate ? Math.ceil(widest(src) * 0.72) : 0, 22) + 26;
    const right = Math.max(56, rotate ? Math.ceil(ctx.measureText(src[src.length - 1] || "").width * 0.72) + 10 : 0);
    const width = left + src.length * cell + right, height = top + tgt.length * cell + 10;
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.round(width * dpr); canvas.height = Math.round(height * dpr);
    canvas.style.width = `${width}px`; canvas.style.height = `${height}px`;
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.fillStyle = bg; ctx.fillRect(0, 0, width, height);
    ctx.font = FONT; ctx.fillStyle = fg;
    src.forEach((tok, s) => {
      const x = left + (s + 0.5) * cell;
      ctx.save();
      if (rotate) {
        ctx.translate(x - 2, top - 6); ctx.rotate(-Math.PI / 4); ctx.textAlign = "left"; ctx.textBaseline = "middle";
        ctx.fillText(tok, 0, 0);
      } else {
        ctx.textAlign = "center"; ctx.textBaseline = "bottom"; ctx.fillText(tok, x, top - 6);
      }
      ctx.restore();
    });
    ctx.fillStyle = muted; ctx.textAlign = "right"; ctx.textBaseline = "bottom";
    ctx.fillText("source →", left - 8, top - 24); ctx.fillText("target ↓", left - 8, top - 6);
    ctx.fillStyle = fg; ctx.textBaseline = "middle";
    tgt.forEach((tok, t) => ctx.fillText(tok, left - 8, top + (t + 0.5) * cell));
    m.forEach((row, t) => row.forEach((v, s) => {
      ctx.fillStyle = viridis(v);
      ctx.fillRect(left + s * cell, top + t * cell, cell - 1, cell - 1);
    }));
    const barX = left + src.length * cell + 16, barH = tgt.length * cell - 1;  // the fixed 0..1 colour bar
    for (let y = 0; y < barH; y++) { ctx.fillStyle = viridis(1 - y / barH); ctx.fillRect(barX, top + y, 12, 1); }
    ctx.fillStyle = muted; ctx.textAlign = "left";
    ctx.fillText("1", barX + 17, top + 6); ctx.fillText("0", barX + 17, top + barH - 6);
    layout = { left, top, cell, m };
    canvas.dataset.drawn = "true";
    canvas.dataset.cells = String(tgt.length * src.length);
  }

  function describeCell(event) {
    if (!layout || !result) return;
    const r = $("heatmap").getBoundingClientRect();
    const s = Math.floor((event.clientX - r.left - layout.left) / layout.cell);
    const t = Math.floor((event.clientY - r.top - layout.top) / layout.cell);
    const inside = t >= 0 && s >= 0 && t < result.tgt_tokens.length && s < result.src_tokens.length;
    $("cell-info").textContent = inside
      ? `${result.tgt_tokens[t]} ← ${result.src_tokens[s]}: ${layout.m[t][s].toFixed(4)}` : "";
  }

  function clear(note) {
    result = null; layout = null;
    const canvas = $("heatmap");
    canvas.dataset.drawn = "false";
    canvas.width = canvas.height = 1;
    canvas.style.width = canvas.style.height = "1px";
    $("layer").disabled = $("head").disabled = true;
    $("attention-note").textContent = note || "";
    $("cell-info").textContent = "";
  }

  // The attention of one source sentence translated from `source` to `target` (one model only).
  async function show(text, source, target) {
    if (pending) pending.abort();
    const via = Languages.pivotOf(source, target);
    if (via) {
      clear(`No one model translates this pair (it goes through ${Languages.name(via)}), so there is no one ` +
        "attention picture to show.");
      return;
    }
    clear("Computing the attention…");
    pending = new AbortController();
    try {
      const data = await Api.call("attention", { method: "POST", json: { text, source, target },
                                                  signal: pending.signal });
      result = data;
      const layers = data.cross_attention.length, heads = data.cross_attention[0].length;
      fillSelect($("layer"), [...Array(layers).keys()].map((l) => [l, `${l + 1}${l === layers - 1 ? " (last)" : ""}`]));
      fillSelect($("head"), [...[...Array(heads).keys()].map((h) => [h, `${h + 1}`]), ["avg", "average"]]);
      $("attention-note").textContent = `The model's own translation of this sentence: “${data.translation}”.`;
      draw();
    } catch (err) {
      if (err.name === "AbortError") return;
      clear(err.message);
    }
  }

  $("layer").addEventListener("change", draw);
  $("head").addEventListener("change", draw);
  $("heatmap").addEventListener("mousemove", describeCell);
  $("heatmap").addEventListener("mouseleave", () => { $("cell-info").textContent = ""; });
  window.addEventListener("resize", draw);
  window.matchMedia("(prefers-color-scheme: dark)").addEventListener("change", draw);

  return { show, clear, draw };
})();
