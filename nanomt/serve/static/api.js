"use strict";
// Every request the page makes goes through here: to this server only, by a path relative to the page (so the page
// works under a URL prefix), with the API key when there is one, and errors said in words a person can act on.

const $ = (id) => document.getElementById(id);

const Api = (() => {
  let key = "";

  class ApiError extends Error {
    constructor(message, status, retryAfter) {
      super(message);
      this.status = status;
      this.retryAfter = retryAfter;
    }
  }

  // What went wrong and what to do, from the status, the server's one-line message and Retry-After.
  function explain(status, message, retryAfter) {
    const wait = retryAfter ? `${retryAfter} second${retryAfter === 1 ? "" : "s"}` : "a few seconds";
    if (status === 403) return "The server needs an API key, and it refused this one (or none was given). " +
      "Type the key in the API key box below.";
    if (status === 413) return `Too much at once for the server: ${message}. Shorten the text (or the file), ` +
      "or translate it in parts.";
    if (status === 415) return `The server cannot read this: ${message}.`;
    if (status === 429) return `Too many requests: ${message}. Wait ${wait}, then try again.`;
    if (status === 503) return `The server is busy or restarting. Wait ${wait}, then try again.`;
    if (status === 504) return "The server took too long to translate this. Try a shorter text.";
    if (status >= 500) return `The server failed on this request (error ${status}). Try again; if it keeps ` +
      "failing, tell whoever runs the server.";
    return message || `The server refused the request (error ${status}).`;
  }

  // Retry-After, else the "retry in N s" of the server's message.
  function retryAfter(res, message) {
    const header = Number(res.headers.get("Retry-After"));
    if (header > 0) return Math.ceil(header);
    const m = /retry in (\d+)/.exec(message || "");
    return m ? Number(m[1]) : null;
  }

  // The JSON answer (or, for `blob`, the bytes) of a request; an ApiError with a readable message otherwise.
  async function call(path, { method = "GET", json, form, signal, blob = false } = {}) {
    const headers = {};
    if (key) headers.Authorization = `Bearer ${key}`;
    let body;
    if (json !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(json);
    } else if (form) {
      body = form;
    }
    let res;
    try {
      res = await fetch(path, { method, headers, body, signal, credentials: "same-origin" });
    } catch (err) {
      if (err.name === "AbortError") throw err;
      throw new ApiError("Cannot reach the server. Check the connection, then try again.", 0, null);
    }
    const isJson = (res.headers.get("Content-Type") || "").includes("json");
    if (!res.ok) {
      // Only the API's own one-line {"error": ...} is shown; an HTML page or a trace from a proxy is not.
      const data = isJson ? await res.json().catch(() => null) : null;
      const message = data && typeof data.error === "string" ? data.error.split("\n")[0] : "";
      const retry = retryAfter(res, message);
      throw new ApiError(explain(res.status, message, retry), res.status, retry);
    }
    if (blob) return res.blob();
    if (!isJson) throw new ApiError("The server answered something other than the API's JSON.", res.status, null);
    return res.json();
  }

  return { call, ApiError, explain, setKey: (k) => { key = k.trim(); }, hasKey: () => key !== "" };
})();

// One error line for the whole page: shown, replaced or cleared.
function showError(message) {
  $("error").textContent = message || "";
  $("error").hidden = !message;
}
