// Loaded into every node process of a container with an egress allowlist (NODE_OPTIONS
// --require, which also runs before an ES module entry point). Node 18 (the minimal image) and
// 22.16 (the default image) ignore HTTP_PROXY/HTTPS_PROXY (NODE_USE_ENV_PROXY came in later
// releases), so without this `https.get` and `fetch` would try to connect directly, which the
// sandbox's firewall refuses. npm needs none of it: it reads HTTPS_PROXY itself. Every request that does
// not name its own agent or dispatcher is tunnelled through the egress proxy with CONNECT,
// honouring NO_PROXY, so `node script.js` works unchanged. The proxy still decides what is
// allowed: this file only routes.
"use strict";

const http = require("node:http");
const https = require("node:https");
const net = require("node:net");
const tls = require("node:tls");

const PROXY_ENV = process.env.HTTPS_PROXY || process.env.https_proxy ||
  process.env.HTTP_PROXY || process.env.http_proxy;

function noProxy(host) {
  const list = (process.env.NO_PROXY || process.env.no_proxy || "").split(",");
  const name = String(host).replace(/^\[|\]$/g, "").toLowerCase();
  return list.some((entry) => {
    const e = entry.trim().toLowerCase().replace(/^\./, "");
    return e === "*" || (e !== "" && (name === e || name.endsWith("." + e)));
  });
}

// A socket to host:port through the proxy's CONNECT; plain TCP, ready for TLS or HTTP.
function tunnel(proxy, host, port, callback) {
  let done = false;
  const finish = (err, socket) => {
    if (done) return;
    done = true;
    callback(err, socket);
  };
  const socket = net.connect(Number(proxy.port) || 80, proxy.hostname);
  const authority = host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
  socket.once("connect", () => {
    socket.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
  });
  let head = Buffer.alloc(0);
  const onData = (chunk) => {
    head = Buffer.concat([head, chunk]);
    const end = head.indexOf("\r\n\r\n");
    if (end < 0) {
      if (head.length > 65536) socket.destroy(new Error("proxy answer too long"));
      return;
    }
    socket.removeListener("data", onData);
    const status = head.subarray(0, head.indexOf("\r\n")).toString("latin1");
    const code = Number(status.split(" ")[1]);
    if (code !== 200) {
      socket.destroy();
      const err = new Error(`egress proxy refused ${authority}: ${status}`);
      err.code = "EPROXYREFUSED";
      finish(err);
      return;
    }
    const rest = head.subarray(end + 4);
    if (rest.length) socket.unshift(rest);
    finish(null, socket);
  };
  socket.on("data", onData);
  socket.once("error", (err) => finish(err));
  socket.once("close", () => finish(new Error(`egress proxy closed the tunnel to ${authority}`)));
}

function connectThrough(proxy, secure) {
  // (options, callback) -> socket, as http.Agent#createConnection and undici's connect take.
  return (options, callback) => {
    const host = options.hostname || options.host || "localhost";
    const port = Number(options.port) || (secure ? 443 : 80);
    tunnel(proxy, host, port, (err, raw) => {
      if (err) return callback(err);
      if (!secure) return callback(null, raw);
      const socket = tls.connect({
        ...options,
        socket: raw,
        servername: options.servername || (net.isIP(host) ? undefined : host),
        ALPNProtocols: options.ALPNProtocols || ["http/1.1"],
      });
      let settled = false;
      socket.once("secureConnect", () => {
        settled = true;
        callback(null, socket);
      });
      socket.once("error", (e) => {
        if (!settled) callback(e);
      });
    });
  };
}

function install(proxyUrl) {
  const proxy = new URL(proxyUrl);

  for (const [mod, secure] of [[http, false], [https, true]]) {
    const Base = mod.Agent;
    const direct = mod.globalAgent;
    const through = connectThrough(proxy, secure);
    class ProxyAgent extends Base {
      createConnection(options, callback) {
        if (noProxy(options.hostname || options.host || "")) {
          return direct.createConnection(options, callback);
        }
        // http.Agent accepts a socket handed to the callback later; return nothing here.
        through(options, callback);
        return undefined;
      }
    }
    mod.globalAgent = new ProxyAgent({ ...direct.options });
  }

  // fetch: undici is bundled inside node and not importable, but its global dispatcher lives
  // under a well-known symbol. A data: URL makes fetch create the default one without touching
  // the network, which hands us undici's Agent class to build a tunnelling one. Done on the
  // first call only: loading undici costs every node process tens of milliseconds.
  const original = globalThis.fetch;
  if (typeof original === "function") {
    let routed = false;
    globalThis.fetch = function fetch(input, init) {
      if (!routed) {
        routed = true;
        try {
          routeFetch(proxy, original);
        } catch (err) {
          process.emitWarning(`shellbox: could not route fetch through the egress proxy: ${err}`);
        }
      }
      return original.call(this, input, init);
    };
  }
}

function routeFetch(proxy, fetch) {
  const key = Symbol.for("undici.globalDispatcher.1");
  if (!globalThis[key]) fetch("data:,").catch(() => {});
  const Agent = globalThis[key] && globalThis[key].constructor;
  if (typeof Agent !== "function") return;
  const viaProxy = { http: connectThrough(proxy, false), https: connectThrough(proxy, true) };
  globalThis[key] = new Agent({
    connect(options, cb) {
      let called = false;
      const callback = (err, socket) => {
        if (!called) {
          called = true;
          cb(err, socket);
        }
      };
      const secure = options.protocol === "https:";
      if (noProxy(options.hostname)) {
        const port = Number(options.port) || (secure ? 443 : 80);
        const s = secure
          ? tls.connect({ host: options.hostname, port, servername: options.servername,
              ALPNProtocols: ["http/1.1"] })
          : net.connect(port, options.hostname);
        s.once(secure ? "secureConnect" : "connect", () => callback(null, s));
        s.once("error", (e) => callback(e));
        return;
      }
      viaProxy[secure ? "https" : "http"](options, callback);
    },
  });
}

if (PROXY_ENV) {
  try {
    install(PROXY_ENV);
  } catch (err) {
    process.emitWarning(`shellbox: could not route node through the egress proxy: ${err}`);
  }
}
