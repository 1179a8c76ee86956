// taskward operator console: the live tail of a task page, nothing else.
// It follows the task's event log through the browser's own EventSource on the API's
// SSE route (the session cookie authenticates it), appends each event to the log,
// grows the output text with every delta and tracks the status. No other script runs.
// An SSE event's data holds no time (docs/events.md), so a row's "At" is filled from
// the JSON pages of the same log, which carry each event's stored `created_at`: the
// rows drawn live then show the same times as the rows the server drew.
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
  const waiting = new Map();  // seq -> the "At" cell of a live row, until its time is read
  let reading = false;

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

  // Reads the times of the rows waiting for one, a page at a time (one request for a
  // burst of deltas); a failed read leaves them waiting for the next event's.
  async function readTimes() {
    if (reading) return;
    reading = true;
    try {
      while (waiting.size) {
        const seqs = Array.from(waiting.keys());  // in the order rows came: by seq
        const first = seqs[0];
        const url = new URL(live.dataset.url, document.baseURI);
        url.searchParams.set("after", String(first - 1));
        url.searchParams.set("limit", String(Math.min(1000, seqs[seqs.length - 1] - first + 1)));
        const answer = await fetch(url, { headers: { Accept: "application/json" } });
        if (!answer.ok) return;
        let filled = 0;
        for (const event of (await answer.json()).data) {
          const at = waiting.get(event.seq);
          if (!at) continue;
          at.textContent = event.created_at;
          waiting.delete(event.seq);
          filled += 1;
        }
        if (!filled) return;
      }
    } catch (error) {
      // The network or the page went away; the next event tries again.
    } finally {
      reading = false;
    }
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
    waiting.set(Number(message.lastEventId), cell(row, ""));
    cell(row, detail(data), "detail");
    readTimes();
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
