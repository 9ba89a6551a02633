// The web interface's only script (served from /web/static/app.js): uploads of the files chosen
// or dropped on a folder's page, one after the other, each with a progress bar. Each file is
// sent as its own request body to the form's data-action (?name=...), with the page's form token
// in X-Form-Token; the server stores it as the three upload steps do. And a folder's page
// follows the change feed (#live): it reloads when a change touches what it shows.
"use strict";

document.addEventListener("DOMContentLoaded", () => {
  const live = document.getElementById("live");
  if (!live) return;
  let cursor = live.dataset.cursor;
  let pause = 1000;
  // Not while an upload runs (it reloads when done) or a field holds what someone typed.
  const quiet = () => !document.body.dataset.uploading &&
    !(document.activeElement && document.activeElement.value);
  const reload = () => { if (quiet()) window.location.reload(); else setTimeout(reload, 1000); };
  const follow = async () => {
    for (;;) {
      try {
        const r = await fetch(live.dataset.changes + "?cursor=" + cursor,
          { credentials: "same-origin", headers: { "Accept": "application/json" } });
        if (r.redirected) return; // signed out
        if (r.status === 200) {
          const m = (await r.json()).message;
          if (m.changed) { reload(); return; }
          cursor = m.cursor;
          pause = 1000;
          continue;
        }
      } catch (_) { /* the server is away: try again later */ }
      await new Promise((done) => setTimeout(done, pause));
      pause = Math.min(pause * 2, 30000);
    }
  };
  follow();
});

document.addEventListener("DOMContentLoaded", () => {
  const form = document.querySelector("form.upload");
  if (!form) return;
  const input = form.querySelector("input[type=file]");
  const drop = form.querySelector(".drop");
  const list = form.querySelector(".progress");

  const sendOne = (file) => new Promise((resolve) => {
    const item = document.createElement("li");
    const bar = document.createElement("progress");
    bar.max = 100;
    bar.value = 0;
    const label = document.createElement("span");
    label.textContent = file.name;
    const state = document.createElement("span");
    state.textContent = "waiting";
    bar.setAttribute("aria-label", "Upload of " + file.name);
    item.append(bar, label, state);
    list.append(item);
    const xhr = new XMLHttpRequest();
    xhr.open("POST", form.dataset.action + "?name=" + encodeURIComponent(file.name));
    xhr.setRequestHeader("X-Form-Token", form.dataset.token);
    xhr.setRequestHeader("Content-Type", "application/octet-stream");
    xhr.upload.onprogress = (e) => {
      if (e.lengthComputable) bar.value = Math.round((100 * e.loaded) / e.total);
      state.textContent = bar.value + "%";
    };
    xhr.onload = () => {
      let ok = xhr.status === 200;
      let text = "done";
      if (!ok) {
        try { text = JSON.parse(xhr.responseText).error.error_text; } catch (_) { text = "failed (" + xhr.status + ")"; }
      }
      bar.value = ok ? 100 : bar.value;
      state.textContent = text;
      item.className = ok ? "done" : "error";
      resolve(ok);
    };
    xhr.onerror = () => { state.textContent = "failed: the connection broke"; item.className = "error"; resolve(false); };
    xhr.send(file);
  });

  const upload = async (files) => {
    if (!files || files.length === 0) return;
    document.body.dataset.uploading = "1";
    let all = true;
    for (const f of Array.from(files)) all = (await sendOne(f)) && all;
    delete document.body.dataset.uploading;
    if (all) window.location.reload();
  };

  form.addEventListener("submit", (e) => { e.preventDefault(); upload(input.files); });
  ["dragenter", "dragover"].forEach((t) => drop.addEventListener(t, (e) => { e.preventDefault(); drop.classList.add("over"); }));
  ["dragleave", "drop"].forEach((t) => drop.addEventListener(t, () => drop.classList.remove("over")));
  drop.addEventListener("drop", (e) => { e.preventDefault(); upload(e.dataTransfer.files); });
});
