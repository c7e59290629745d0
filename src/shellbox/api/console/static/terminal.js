// The container page's live terminal: xterm.js (vendored) on the PTY WebSocket,
// GET /v1/containers/{id}/pty. A browser cannot put a key in a WebSocket's headers, so the
// page first asks the console (its session cookie, plus the CSRF token) for a token that
// stands for the operator on this container for a minute, and sends it in the query.
"use strict";
(function () {
  const box = document.getElementById("terminal");
  const button = document.getElementById("open-terminal");
  const state = document.getElementById("terminal-state");
  if (!box || !button) return;
  let socket = null;

  function say(text) { state.textContent = text; }

  async function open() {
    button.disabled = true;
    say("connecting…");
    let token;
    try {
      const r = await fetch(box.dataset.tokenUrl, {
        method: "POST", credentials: "same-origin", headers: {"X-CSRF-Token": box.dataset.csrf},
      });
      if (!r.ok) throw new Error("the console refused a terminal token (" + r.status + ")");
      token = (await r.json()).token;
    } catch (err) {
      say(String(err.message || err)); button.disabled = false; return;
    }
    box.textContent = "";
    const term = new Terminal({cursorBlink: true, fontSize: 14, convertEol: false,
      fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, monospace',
      theme: {background: "#0b0f19"}});
    const fit = new FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    const scheme = location.protocol === "https:" ? "wss:" : "ws:";
    const url = scheme + "//" + location.host + "/v1/containers/" +
      encodeURIComponent(box.dataset.container) + "/pty?cols=" + term.cols + "&rows=" +
      term.rows + "&token=" + encodeURIComponent(token);
    socket = new WebSocket(url);
    socket.binaryType = "arraybuffer";
    const encoder = new TextEncoder();
    socket.onopen = function () { say("connected"); term.focus(); };
    socket.onmessage = function (ev) {
      if (typeof ev.data === "string") {
        const msg = JSON.parse(ev.data);
        if (msg.type === "exit") term.write("\r\n[exited with " + msg.exit_code + "]\r\n");
      } else {
        term.write(new Uint8Array(ev.data));
      }
    };
    socket.onclose = function (ev) {
      say("disconnected" + (ev.reason ? ": " + ev.reason : ""));
      button.disabled = false;
      button.textContent = "Reconnect";
    };
    term.onData(function (data) {
      if (socket && socket.readyState === WebSocket.OPEN) socket.send(encoder.encode(data));
    });
    term.onResize(function (size) {
      if (socket && socket.readyState === WebSocket.OPEN)
        socket.send(JSON.stringify({type: "resize", cols: size.cols, rows: size.rows}));
    });
    window.addEventListener("resize", function () { fit.fit(); });
  }

  button.addEventListener("click", function () {
    if (socket) { socket.close(); socket = null; }
    open();
  });
})();
