"use strict";
// How far to trust the translation: the server's per-sentence confidence (POST translate with confidence: the
// model's estimate of the sentence's chrF / 100) shades each sentence, its doubtful words (probability under one
// half) are underlined, and a legend says what the marks mean. Marks are classes and titles (not colour alone),
// built from text nodes only: no server text goes through innerHTML.

const Confidence = (() => {
  const HIGH = 0.6, MEDIUM = 0.4;  // >= HIGH: no shading; MEDIUM..HIGH: amber; under MEDIUM: red
  const LEVELS = ["conf-high", "conf-medium", "conf-low"];
  const word = /[\p{L}\p{N}\p{M}]/u;

  const level = (c) => (c >= HIGH ? "conf-high" : c >= MEDIUM ? "conf-medium" : "conf-low");
  const fixed = (x) => Number(x).toFixed(2);

  // The confidence part of a translate answer, one text's: {calibrated, sentences}, or null when the server sent
  // none (an older server, or one that refused the field). nanomt's answer has a list a text, LibreTranslate's for
  // one q string not.
  function of(answer) {
    if (!answer || !Array.isArray(answer.sentences) || typeof answer.calibrated !== "boolean") return null;
    const sentences = Array.isArray(answer.sentences[0]) ? answer.sentences[0] : answer.sentences;
    if (!sentences.every((s) => s && typeof s.translation === "string")) return null;
    return { calibrated: answer.calibrated, sentences };
  }

  // Where `w` stands as a whole word in `text` from `from` on (not inside a longer word), or -1.
  function wholeWord(text, w, from) {
    for (let i = text.indexOf(w, from); i >= 0; i = text.indexOf(w, i + 1)) {
      const before = i > 0 ? text[i - 1] : "", after = text[i + w.length] || "";
      if (!(before && word.test(before) && word.test(w[0])) && !(after && word.test(after) && word.test(w.at(-1)))) {
        return i;
      }
    }
    return -1;
  }

  // Each doubtful word's probability, in order: the next entry of `words` with that word under one half.
  function probabilities(sentence) {
    const words = Array.isArray(sentence.words) ? sentence.words : [];
    let k = 0;
    return (sentence.doubtful || []).map((w) => {
      let j = words.findIndex((x, i) => i >= k && x.word === w && x.probability < 0.5);
      if (j < 0) j = words.findIndex((x) => x.word === w);
      if (j < 0) return null;
      k = j + 1;
      return words[j].probability;
    });
  }

  // The sentence's text as nodes, its doubtful words (found in order, whole words) in underlined spans.
  function words(sentence) {
    const text = sentence.translation, nodes = [], probs = probabilities(sentence);
    let cursor = 0;
    (sentence.doubtful || []).forEach((w, n) => {
      if (typeof w !== "string" || !w) return;
      const at = wholeWord(text, w, cursor);
      if (at < 0) return;
      if (at > cursor) nodes.push(document.createTextNode(text.slice(cursor, at)));
      const span = document.createElement("span");
      span.className = "doubtful";
      span.textContent = w;
      span.title = probs[n] == null ? "doubtful word" : `word probability ${fixed(probs[n])}`;
      nodes.push(span);
      cursor = at + w.length;
    });
    if (cursor < text.length) nodes.push(document.createTextNode(text.slice(cursor)));
    return nodes;
  }

  // Mark a sentence's span: its level's class and title, and its doubtful words (the span holds its translation).
  function mark(span, sentence) {
    const c = sentence.confidence;
    if (typeof c !== "number") return;
    span.sentence = sentence;
    span.classList.add(level(c));
    span.dataset.confidence = String(c);
    span.title = `confidence ${fixed(c)} · click for alternatives and attention`;
    span.replaceChildren(...words(sentence));
  }

  // A sentence's text changed (an alternative picked): its marks were the old text's.
  function forget(span) {
    span.classList.remove(...LEVELS);
    delete span.dataset.confidence;
    span.title = "Alternatives and attention of this sentence";
  }

  // An alternative picked for a sentence: its text; the marks again only when it is the marked translation.
  function retext(span, text) {
    const sentence = span.sentence;
    span.textContent = text;
    forget(span);
    if (sentence && text === sentence.translation) mark(span, sentence);
  }

  // The legend under the translation: the marks explained when there are confidences, the line saying why there
  // are none when the model has no calibration, nothing when the server sent no confidence.
  function legend(conf) {
    const shaded = Boolean(conf && conf.calibrated && conf.sentences.some((s) => typeof s.confidence === "number"));
    $("confidence-legend").hidden = !shaded;
    $("confidence-none").hidden = !(conf && !conf.calibrated);
  }

  return { of, level, mark, retext, legend, wholeWord };
})();
