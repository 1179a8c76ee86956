// taskward operator console: the live tail of a task page, nothing else.
// It follows the task's event log through the browser's own EventSource on the API's
// SSE route (the session cookie authenticates it), appends each event to the log,
// grows the output text with every delta and tracks the status. No other script runs.
"use strict";
(function () {
  const live = document.getElementById("live");
  if (!live || !window.EventSource) return;
  const output = document.getElementById("output");
  const status = document.querySelector("#status .status");
  const rows = document.getElementById("events");
  const lifecycle = JSON.parse(live.dataset.lifecycle);
  const terminal = new Set(JSON.parse(live.dataset.terminal));
  const source = new EventSource(live.dataset.url);

  function cell(row, text, className) {
    const td = row.insertCell();
    if (className) td.className = className;
    td.textContent = text;
    return td;
  }

  function detail(data) {
    if ("delta" in data) return JSON.stringify(data.delta);
    if (data.reason) return "reason: " + data.reason;
    const error = data.response && data.response.error;
    return error ? "error: " + error.code : "";
  }

  function onEvent(message) {
    const data = JSON.parse(message.data);
    if (data.type === "response.output_text.delta") output.textContent += data.delta;
    const state = lifecycle[data.type];
    if (state && status) {
      status.textContent = state;
      status.className = "status status-" + state;
    }
    const row = rows.insertRow();
    cell(row, message.lastEventId);
    cell(row, "").appendChild(document.createElement("code")).textContent = data.type;
    cell(row, new Date().toISOString());
    cell(row, detail(data), "detail");
    if (terminal.has(data.type)) {
      source.close();
      live.textContent = "finished";
      const cancel = document.getElementById("cancel");
      if (cancel) cancel.remove();
    }
  }

  for (const type of JSON.parse(live.dataset.types)) source.addEventListener(type, onEvent);
  source.onopen = function () { live.textContent = "following live"; };
  source.onerror = function () {
    live.textContent = source.readyState === EventSource.CLOSED ? "disconnected" : "reconnecting…";
  };
})();
