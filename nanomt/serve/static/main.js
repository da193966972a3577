"use strict";
// Start-up: what the server serves (health, frontend/settings, languages), the API key box, the models' state.

const ModelStatus = (() => {
  let models = [];

  function describe(m) {
    const [from, to] = m.pair.split("-").map(Languages.name);
    const state = m.loaded ? `loaded on ${m.device}` : "not loaded yet (it loads with its first translation)";
    return `${from} → ${to}: ${state}`;
  }

  function show(health) {
    models = health.models || [];
    $("model-status").textContent = models.map(describe).join(" · ");
  }

  // After a translation: a model that was not loaded may be now.
  async function refresh() {
    if (models.every((m) => m.loaded)) return;
    try { show(await Api.call("health")); } catch { /* the status line is a convenience */ }
  }

  return { show, refresh };
})();

const Key = (() => {
  const STORE = "nanomt.apiKey";

  function init(required) {
    $("key-box").hidden = !required;
    if (!required) return;
    let stored = null;
    try { stored = localStorage.getItem(STORE); } catch { /* storage off: the key lives in the page only */ }
    if (stored) { $("api-key").value = stored; $("remember-key").checked = true; }
    Api.setKey($("api-key").value);
  }

  function save() {
    Api.setKey($("api-key").value);
    try {
      if ($("remember-key").checked && $("api-key").value.trim()) localStorage.setItem(STORE, $("api-key").value.trim());
      else localStorage.removeItem(STORE);
    } catch { /* storage off */ }
  }

  $("api-key").addEventListener("input", save);
  $("remember-key").addEventListener("change", save);
  return { init };
})();

function swapLanguages() {
  const translation = Translate.translation();
  if (!Languages.swap()) return;
  if (translation) $("source").value = translation;
  Translate.run();
}

$("swap").addEventListener("click", swapLanguages);
document.addEventListener("keydown", (e) => {
  if (e.altKey && (e.key === "s" || e.key === "S")) { e.preventDefault(); swapLanguages(); }
});

(async function start() {
  try {
    const [health, settings] = await Promise.all([Api.call("health"), Api.call("frontend/settings")]);
    Key.init(settings.keyRequired);
    Translate.init(settings.charLimit);
    Files.init(settings.supportedFilesFormat);
    await Languages.load(health);
    ModelStatus.show(health);
    document.body.dataset.ready = "true";
    if ($("source").value.trim()) Translate.run();  // text kept by the browser on reload
  } catch (err) {
    $("model-status").textContent = "";
    showError(`The page cannot start: ${err.message}`);
  }
})();
