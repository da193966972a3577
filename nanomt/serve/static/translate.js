"use strict";
// Translation as you type: after a short pause the whole text goes to POST translate as one document (LibreTranslate's
// request, so the page uses what clients use; nanomt's with a glossary, which LibreTranslate's lacks), the request
// before it cancelled, asking for each sentence's confidence. The translation is shown sentence by sentence, each
// shaded by its confidence (confidence.js): a click (or Enter) on one shows its alternatives and its attention.

const Translate = (() => {
  const DEBOUNCE_MS = 100;  // short: the keystroke-to-translation time is this, the request and the render
  let charLimit = Infinity;
  let timer = null, inFlight = null, seq = 0;
  let shown = null;  // {source, target, from, to} of the translation on screen
  const timing = { input: 0, sent: 0, answered: 0, shown: 0 };

  // Sentences of one line, each with the spaces after it: "a b. c d." -> ["a b. ", "c d."].
  const sentences = (line) => line.match(/\S[\s\S]*?(?:[.!?…。！？]+["'”’)\]]*(?=\s|$)\s*|$)/g) || [];

  function glossary() {
    return $("glossary").value.split("\n").map((line) => line.split(/\t| = /))
      .filter((p) => p.length === 2 && p[0].trim() && p[1].trim()).map((p) => [p[0].trim(), p[1].trim()]);
  }

  function count() {
    const n = $("source").value.length;
    const over = n > charLimit;
    $("counter").textContent = Number.isFinite(charLimit)
      ? `${n.toLocaleString("en")} / ${charLimit.toLocaleString("en")} characters` : `${n} characters`;
    $("counter").classList.toggle("over", over);
    return over;
  }

  function busy(on) {
    $("output").setAttribute("aria-busy", String(on));
  }

  // A sentence of the translation: a span that knows its source sentence, a click (or Enter) away from its
  // alternatives and attention.
  function sentenceSpan(text, source) {
    const span = document.createElement("span");
    span.className = "sent";
    span.textContent = text;
    span.tabIndex = 0;
    span.setAttribute("role", "button");
    span.title = "Alternatives and attention of this sentence";
    span.dataset.source = source.trim();
    return span;
  }

  // Without the server's sentences: a line a paragraph, a span a sentence whose source is the source line's sentence
  // of the same index (or the whole line when the two lines split into different counts).
  function byLines(source, target) {
    const srcLines = source.split("\n"), tgtLines = target.split("\n");
    const nodes = [];
    tgtLines.forEach((line, i) => {
      if (i) nodes.push(document.createTextNode("\n"));
      const srcLine = srcLines.length === tgtLines.length ? srcLines[i] : source;
      const tgtSents = sentences(line), srcSents = sentences(srcLine);
      const lead = line.match(/^\s*/)[0];
      if (lead) nodes.push(document.createTextNode(lead));
      tgtSents.forEach((sent, j) => {
        const text = sent.trimEnd();
        nodes.push(sentenceSpan(text, srcSents.length === tgtSents.length ? srcSents[j] : srcLine));
        if (sent.length > text.length) nodes.push(document.createTextNode(sent.slice(text.length)));
      });
    });
    return nodes;
  }

  // With the server's sentences (confidence): each one's translation found in the target in order, the text between
  // them kept as it is, so the output reads exactly as the target; each span shaded by its confidence. null when a
  // sentence is not found there, or none is (the lines are split here then, with no marks).
  function bySentences(target, conf) {
    const nodes = [];
    let cursor = 0;
    for (const s of conf.sentences) {
      if (!s.translation) continue;
      const at = target.indexOf(s.translation, cursor);
      if (at < 0) return null;
      if (at > cursor) nodes.push(document.createTextNode(target.slice(cursor, at)));
      const span = sentenceSpan(s.translation, typeof s.source === "string" ? s.source : "");
      if (conf.calibrated) Confidence.mark(span, s);
      nodes.push(span);
      cursor = at + s.translation.length;
    }
    if (cursor < target.length) nodes.push(document.createTextNode(target.slice(cursor)));
    return nodes.some((n) => n.nodeType === Node.ELEMENT_NODE) || !target.trim() ? nodes : null;
  }

  // The translation on screen, with the confidence legend when `conf` (Confidence.of a translate answer) has marks.
  function render(source, target, conf = null) {
    const marked = conf ? bySentences(target, conf) : null;
    $("output").replaceChildren(...(marked || byLines(source, target)));
    Confidence.legend(marked ? conf : null);
    $("output").dataset.state = target ? "done" : "empty";
    $("copy").disabled = !target;
  }

  function clearOutput() {
    $("output").replaceChildren();
    Confidence.legend(null);
    $("output").dataset.state = "empty";
    $("output-meta").textContent = "";
    $("copy").disabled = true;
    shown = null;
    Sentence.close();
  }

  // POST translate asking for the sentences' confidence too; a server that refuses the field (400, 422) is asked
  // again without it, and the translation shows with no marks.
  async function withConfidence(body, signal) {
    try {
      return await Api.call("translate", { method: "POST", json: { ...body, confidence: true }, signal });
    } catch (err) {
      if (!(err instanceof Api.ApiError) || ![400, 422].includes(err.status)) throw err;
      return Api.call("translate", { method: "POST", json: body, signal });
    }
  }

  async function run() {
    clearTimeout(timer);
    const text = $("source").value;
    if (inFlight) inFlight.abort();
    inFlight = null;
    if (count()) {
      showError(`The text has ${text.length.toLocaleString("en")} characters; this server translates at most ` +
        `${charLimit.toLocaleString("en")} at once. Shorten it, or translate it in parts.`);
      return;
    }
    if (!text.trim()) { clearOutput(); showError(""); busy(false); return; }
    const from = Languages.source(), to = Languages.target(), terms = glossary();
    const mine = ++seq, controller = new AbortController();
    inFlight = controller;
    busy(true);
    timing.sent = performance.now();
    try {
      let translated, detected = null, missed = false, conf = null;
      const signal = controller.signal;
      if (terms.length) {
        let src = from;
        if (src === "auto") {
          detected = (await Api.call("detect", { method: "POST", json: { q: text }, signal }))[0].language;
          src = detected;
        }
        const body = { text: [text], split: true, source: src, target: to, glossary: terms };
        const r = await withConfidence(body, signal);
        translated = r.translations[0];
        missed = Boolean(r.terms_missed);
        conf = Confidence.of(r);
      } else {
        const body = { q: text, source: from, target: to, format: "text" };
        const r = await withConfidence(body, signal);
        translated = r.translatedText;
        detected = r.detectedLanguage ? r.detectedLanguage.language : null;
        conf = Confidence.of(r);
      }
      if (mine !== seq) return;
      timing.answered = performance.now();
      if (from === "auto") Languages.setDetected(detected);
      shown = { source: text, target: translated, from: from === "auto" ? detected : from, to };
      render(text, translated, conf);
      $("output").lang = to;
      $("output-meta").textContent = missed ? "A glossary term could not be placed in every sentence." : "";
      showError("");
      Sentence.close();
      requestAnimationFrame(() => { timing.shown = performance.now(); $("output").dataset.seq = String(mine); });
      ModelStatus.refresh();
    } catch (err) {
      if (err.name === "AbortError" || mine !== seq) return;
      showError(err.message);
    } finally {
      if (mine === seq) { busy(false); inFlight = null; }
    }
  }

  function soon() {
    timing.input = performance.now();
    count();
    clearTimeout(timer);
    timer = setTimeout(run, DEBOUNCE_MS);
  }

  async function copy() {
    const text = $("output").textContent;
    try {
      await navigator.clipboard.writeText(text);
    } catch {
      const range = document.createRange();  // no clipboard API (e.g. plain http to another host): select and copy
      range.selectNodeContents($("output"));
      const sel = getSelection();
      sel.removeAllRanges(); sel.addRange(range);
      document.execCommand("copy");
    }
    $("copy").textContent = "Copied";
    setTimeout(() => { $("copy").textContent = "Copy"; }, 1500);
  }

  function init(limit) {
    charLimit = limit || Infinity;
    count();
  }

  $("source").addEventListener("input", soon);
  $("glossary").addEventListener("input", soon);
  $("source-lang").addEventListener("change", run);
  $("target-lang").addEventListener("change", run);
  $("translate").addEventListener("click", run);
  $("clear").addEventListener("click", () => { $("source").value = ""; run(); $("source").focus(); });
  $("copy").addEventListener("click", copy);
  $("source").addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); run(); }
  });

  const translation = () => (shown ? $("output").textContent : "");
  return { init, run, render, timing, current: () => shown, translation };
})();

// The selected sentence of the translation: its alternatives (POST translate with alternatives) and its attention.
const Sentence = (() => {
  let selected = null, pending = null;

  function close() {
    if (pending) pending.abort();
    if (selected) selected.classList.remove("selected");
    selected = null;
    $("sentence").hidden = true;
    Attention.clear();
  }

  async function select(span) {
    const pair = Translate.current();
    if (!pair) return;
    if (selected) selected.classList.remove("selected");
    selected = span;
    span.classList.add("selected");
    $("sentence").hidden = false;
    $("sentence-source").textContent = span.dataset.source;
    $("alternatives").replaceChildren(Object.assign(document.createElement("li"), { textContent: "Looking…" }));
    $("alternatives").dataset.state = "loading";
    Attention.show(span.dataset.source, pair.from, pair.to);
    if (pending) pending.abort();
    pending = new AbortController();
    try {
      const body = { q: span.dataset.source, source: pair.from, target: pair.to, alternatives: 3 };
      const r = await Api.call("translate", { method: "POST", json: body, signal: pending.signal });
      const options = [...new Set([span.textContent, r.translatedText, ...(r.alternatives || [])])]
        .filter((t) => t.trim());
      $("alternatives").replaceChildren(...options.map((text) => {
        const li = document.createElement("li"), button = document.createElement("button");
        button.type = "button";
        button.textContent = text;
        button.setAttribute("aria-pressed", String(text === span.textContent));
        button.addEventListener("click", () => {
          Confidence.retext(span, text);
          $("alternatives").querySelectorAll("button").forEach((b) => b.setAttribute("aria-pressed", "false"));
          button.setAttribute("aria-pressed", "true");
        });
        li.append(button);
        return li;
      }));
      $("alternatives").dataset.state = "done";
    } catch (err) {
      if (err.name === "AbortError") return;
      $("alternatives").replaceChildren(Object.assign(document.createElement("li"), { textContent: err.message }));
      $("alternatives").dataset.state = "error";
    }
  }

  const target = (e) => e.target.closest && e.target.closest(".sent");
  $("output").addEventListener("click", (e) => { if (target(e)) select(target(e)); });
  $("output").addEventListener("keydown", (e) => {
    if (target(e) && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); select(target(e)); }
  });
  return { select, close };
})();
