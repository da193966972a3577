"use strict";
// A file in, its translation out: pick or drop a file of a format the server takes, POST it as a job (file_jobs), follow
// its progress (sentences done of all, a bar) until it is done, then fetch the translated file (by a path relative to
// the page) and offer it as a download. Cancel stops the job on the server.

const Files = (() => {
  const maxBytes = Number(document.body.dataset.maxFileBytes) || 10 * 2 ** 20;
  // Every suffix the server takes (its file input's accept attribute), and the one a format it names.
  const suffixes = (list) => list.split(",").filter(Boolean).map((x) => x.replace(/^\./, "").toLowerCase());
  let formats = suffixes($("file").accept);
  const named = suffixes(document.body.dataset.fileShown || "");
  let file = null, download = null, job = null;  // job: the id of the file job running, if one is
  const POLL_MS = 500, ENDED = ["done", "failed", "cancelled"], PATIENCE = 10;  // PATIENCE: failed polls in a row

  const size = (n) => (n >= 2 ** 20 ? `${(n / 2 ** 20).toFixed(1)} MB` : `${Math.ceil(n / 1024)} kB`);
  const extension = (name) => (name.includes(".") ? name.split(".").pop().toLowerCase() : "");

  // A file picked or dropped: refused here when its type or size will not do (the server would refuse it too). While
  // a job runs, the next file waits for it to end.
  function choose(f) {
    file = null;
    $("translate-file").disabled = true;
    if (!job) $("download").hidden = true;
    if (!f) return;
    $("file-name").textContent = `${f.name} (${size(f.size)})`;
    if (!formats.includes(extension(f.name))) {
      $("file-status").textContent = `A .${extension(f.name) || "?"} file cannot be translated: use ` +
        `${formats.map((x) => "." + x).join(", ")}.`;
      return;
    }
    if (f.size > maxBytes) {
      $("file-status").textContent = `${f.name} is ${size(f.size)}; the server takes files up to ${size(maxBytes)}.`;
      return;
    }
    file = f;
    if (job) return;
    $("file-status").textContent = "";
    $("translate-file").disabled = false;
  }

  const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
  const count = (n) => n.toLocaleString("en");

  // The job's sentences done of all, on the bar (a moving bar while the file is being read).
  function showProgress(state) {
    const bar = $("file-progress"), total = state.sentences_total;
    $("file-progress-box").hidden = false;
    if (total > 0) {
      bar.max = total;
      bar.value = Math.min(state.sentences_done, total);
      $("file-progress-text").textContent = `${count(state.sentences_done)} of ${count(total)} sentences`;
    } else {
      bar.removeAttribute("value");
      $("file-progress-text").textContent = state.status === "queued" ? "waiting for its turn" : "reading the file";
    }
  }

  // The job's state every POLL_MS until it ends; a server that is busy or unreachable a while is asked again.
  async function follow(state) {
    let failures = 0;
    while (!ENDED.includes(state.status)) {
      await sleep(POLL_MS);
      try {
        state = await Api.call(`file_jobs/${encodeURIComponent(state.id)}`);
        failures = 0;
      } catch (err) {
        if (!(err instanceof Api.ApiError) || ![0, 503].includes(err.status) || ++failures >= PATIENCE) throw err;
        await sleep((err.retryAfter || 1) * 1000);
        continue;
      }
      showProgress(state);
    }
    return state;
  }

  async function cancel() {
    if (!job) return;
    $("cancel-file").disabled = true;
    $("file-status").textContent = "Cancelling…";
    try {
      await Api.call(`file_jobs/${encodeURIComponent(job)}`, { method: "DELETE" });
    } catch (err) {
      $("cancel-file").disabled = false;
      showError(err.message);
    }
  }

  async function translate() {
    if (!file || job) return;
    const source = Languages.effectiveSource(), target = Languages.target();
    if (!source) {
      $("file-status").textContent = "Choose the file's language under From (it is detected from typed text only).";
      return;
    }
    const picked = file, form = new FormData();
    form.append("file", picked, picked.name);
    form.append("source", source);
    form.append("target", target);
    $("translate-file").disabled = true;
    $("download").hidden = true;
    $("file-status").textContent = `Translating ${picked.name}…`;
    try {
      let state = await Api.call("file_jobs", { method: "POST", form });
      job = state.id;
      $("cancel-file").disabled = false;
      $("cancel-file").hidden = false;
      showProgress(state);
      state = await follow(state);
      if (state.status === "cancelled") {
        $("file-status").textContent = `${picked.name}: cancelled.`;
        return;
      }
      if (state.status === "failed") {
        throw new Api.ApiError(Api.explain(state.error_code || 500, state.error || ""), state.error_code, null);
      }
      // The server's URL names its own host; behind a proxy only a path relative to the page reaches it.
      const url = state.translatedFileUrl, at = url.lastIndexOf("download_file/");
      const blob = await Api.call(at >= 0 ? url.slice(at) : url, { blob: true });
      if (download) URL.revokeObjectURL(download);
      download = URL.createObjectURL(blob);
      const link = $("download"), name = picked.name.replace(/(\.[^.]+)?$/, (ext) => `.${target}${ext}`);
      link.href = download;
      link.download = name;
      link.textContent = `Download ${name}`;
      link.hidden = false;
      $("file-status").textContent = "Translated.";
      link.focus();
    } catch (err) {
      $("file-status").textContent = "";
      showError(`${picked.name}: ${err.message}`);
    } finally {
      job = null;
      $("cancel-file").hidden = true;
      $("file-progress-box").hidden = true;
      $("translate-file").disabled = !file;
    }
  }

  function init(supported) {
    if (supported && supported.length) formats = supported.map((x) => x.replace(/^\./, "").toLowerCase());
    $("file").accept = formats.map((x) => "." + x).join(",");
    const shown = formats.filter((x) => named.includes(x));
    $("file-limits").textContent = `A ${(shown.length ? shown : formats).map((x) => "." + x).join(", ")} file of up to ${size(maxBytes)}, ` +
      "translated from and to the languages chosen above, its formatting kept.";
  }

  const drop = $("drop");
  $("file").addEventListener("change", () => choose($("file").files[0]));
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    choose(e.dataTransfer.files[0]);
  });
  $("translate-file").addEventListener("click", translate);
  $("cancel-file").addEventListener("click", cancel);
  return { init };
})();
