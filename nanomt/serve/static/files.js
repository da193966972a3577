"use strict";
// A file in, its translation out: pick or drop a file of a format the server takes, POST translate_file, then fetch the
// translated file (by a path relative to the page) and offer it as a download.

const Files = (() => {
  const maxBytes = Number(document.body.dataset.maxFileBytes) || 10 * 2 ** 20;
  // Every suffix the server takes (its file input's accept attribute), and the one a format it names.
  const suffixes = (list) => list.split(",").filter(Boolean).map((x) => x.replace(/^\./, "").toLowerCase());
  let formats = suffixes($("file").accept);
  const named = suffixes(document.body.dataset.fileShown || "");
  let file = null, download = null;

  const size = (n) => (n >= 2 ** 20 ? `${(n / 2 ** 20).toFixed(1)} MB` : `${Math.ceil(n / 1024)} kB`);
  const extension = (name) => (name.includes(".") ? name.split(".").pop().toLowerCase() : "");

  // A file picked or dropped: refused here when its type or size will not do (the server would refuse it too).
  function choose(f) {
    file = null;
    $("translate-file").disabled = true;
    $("download").hidden = true;
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
    $("file-status").textContent = "";
    $("translate-file").disabled = false;
  }

  async function translate() {
    if (!file) return;
    const source = Languages.effectiveSource(), target = Languages.target();
    if (!source) {
      $("file-status").textContent = "Choose the file's language under From (it is detected from typed text only).";
      return;
    }
    const form = new FormData();
    form.append("file", file, file.name);
    form.append("source", source);
    form.append("target", target);
    $("translate-file").disabled = true;
    $("file-status").textContent = `Translating ${file.name}…`;
    try {
      const { translatedFileUrl } = await Api.call("translate_file", { method: "POST", form });
      // The server's URL names its own host; behind a proxy only a path relative to the page reaches it.
      const at = translatedFileUrl.lastIndexOf("download_file/");
      const blob = await Api.call(at >= 0 ? translatedFileUrl.slice(at) : translatedFileUrl, { blob: true });
      if (download) URL.revokeObjectURL(download);
      download = URL.createObjectURL(blob);
      const link = $("download"), name = file.name.replace(/(\.[^.]+)?$/, (ext) => `.${target}${ext}`);
      link.href = download;
      link.download = name;
      link.textContent = `Download ${name}`;
      link.hidden = false;
      $("file-status").textContent = "Translated.";
      link.focus();
    } catch (err) {
      $("file-status").textContent = "";
      showError(`${file.name}: ${err.message}`);
    } finally {
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
  return { init };
})();
