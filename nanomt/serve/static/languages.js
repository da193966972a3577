"use strict";
// The source and target pickers, filled from GET languages (names, not only codes): "auto" detects the source,
// a pair no one model translates is marked as going through the pivot language, and the swap button swaps.

const Languages = (() => {
  let langs = [];          // GET languages: [{code, name, targets}]
  let direct = new Set();  // "de-en" for each pair one model translates (GET health)
  let detected = null;     // the language the server detected for the source text (source auto)

  // GET languages names the sources only; a language only translated into is named by the browser (Intl). A code
  // it has no name for stays as it is: its default fallback gives the code canonicalized ("src" became "sc").
  const display = window.Intl && Intl.DisplayNames
    ? new Intl.DisplayNames(["en"], { type: "language", fallback: "none" }) : null;
  function name(code) {
    const served = langs.find((l) => l.code === code);
    if (served && served.name !== code) return served.name;
    try { return (display && display.of(code)) || code; } catch { return code; }
  }
  const source = () => $("source-lang").value;
  const target = () => $("target-lang").value;
  // The source of a request: the chosen one, or the detected one for auto (null before a detection).
  const effectiveSource = () => (source() === "auto" ? detected : source());

  // The language the pivot goes through, for a pair no one model translates (null when one model does).
  function pivotOf(src, tgt) {
    if (!src || direct.has(`${src}-${tgt}`)) return null;
    const via = langs.map((l) => l.code).find((p) => direct.has(`${src}-${p}`) && direct.has(`${p}-${tgt}`));
    return via || null;
  }

  function targetsOf(src) {
    if (src !== "auto") return (langs.find((l) => l.code === src) || { targets: [] }).targets;
    return [...new Set(langs.flatMap((l) => l.targets))].sort();
  }

  function fillTargets(keep) {
    const src = source(), select = $("target-lang");
    const options = targetsOf(src).map((code) => {
      const via = src === "auto" ? null : pivotOf(src, code);
      return new Option(via ? `${name(code)} (through ${name(via)})` : name(code), code);
    });
    select.replaceChildren(...options);
    if (keep && options.some((o) => o.value === keep)) select.value = keep;
    describePair();
  }

  function describePair() {
    const via = pivotOf(effectiveSource(), target());
    $("pivot-note").textContent = via
      ? `${name(effectiveSource())} to ${name(target())} goes through ${name(via)}: two models, one after the other.`
      : "";
    $("detected").textContent = source() === "auto"
      ? (detected ? `Detected: ${name(detected)}.` : "The language is detected as you type.") : "";
  }

  function setDetected(code) {
    detected = code;
    describePair();
  }

  // Swap: the target becomes the source (the detected language stands for auto) and the other way round.
  function swap() {
    const from = effectiveSource(), to = target();
    if (!from || !targetsOf(to).length) return false;
    $("source-lang").value = to;
    detected = null;
    fillTargets(from);
    return true;
  }

  async function load(health) {
    langs = await Api.call("languages");
    direct = new Set((health ? health.models : []).map((m) => m.pair));
    const options = [new Option("Detect the language", "auto"), ...langs.map((l) => new Option(l.name, l.code))];
    $("source-lang").replaceChildren(...options);
    const first = health && health.languages;
    $("source-lang").value = first && langs.some((l) => l.code === first.source) ? first.source : langs[0].code;
    fillTargets(first && first.target);
  }

  $("source-lang").addEventListener("change", () => { detected = null; fillTargets(target()); });
  $("target-lang").addEventListener("change", describePair);

  return { load, swap, name, source, target, effectiveSource, setDetected, pivotOf, describePair };
})();
