"""A stand-in for the internet: an HTTP and HTTPS server the egress tests run inside a network
namespace of their own (``python upstream.py --cert C --key K --log L``).

Routes (any host name, the certificate carries the test names):
    /echo            JSON of the request as received: method, path, headers
    /echo-big?n=N    the same JSON, repeated, padded to more than N bytes (a streamed body)
    /bytes/N         N bytes of b"x" (downloads)
    /ws?h=NAME&form=FORM
                     a WebSocket that sends the header NAME back (``reflect``), then closes
    /reflect?h=NAME&form=FORM&pre=P[&n=N[&noise=1]][&gzip=1][&chunked=1]
                     the request header NAME sent back transformed (``reflect``), after the
                     prefix P: as the body, in a response header ``x-reflect`` and in the
                     status line's reason; with n, the body repeats it past N bytes (streamed),
                     padded with dots or with random hex (noise)
Every request's method, host, path and headers are appended to the JSON-lines ``--log``, so a
test can see what reached the upstream; the SNI of every TLS handshake goes to ``--log``.sni.
"""

from __future__ import annotations

import argparse
import base64
import gzip
import hashlib
import html
import json
import os
import ssl
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CHUNK = 256 * 1024
WS_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC11808"
_lock = threading.Lock()


def reflect(form: str, data: bytes) -> bytes:
    """``data`` in one of the forms an upstream may send a credential back in."""
    forms = {
        "raw": lambda d: d,
        "upper": bytes.upper,
        "lower": bytes.lower,
        "swapcase": bytes.swapcase,
        "b64": base64.b64encode,
        "b64upper": lambda d: base64.b64encode(d).upper(),
        "b64url": lambda d: base64.urlsafe_b64encode(d).rstrip(b"="),
        "b64mime": lambda d: base64.encodebytes(d),
        "hex": lambda d: d.hex().encode(),
        "hexupper": lambda d: d.hex().upper().encode(),
        "url": lambda d: urllib.parse.quote(d, safe="").encode(),
        "urlplus": lambda d: urllib.parse.quote_plus(d).encode(),
        "urlall": lambda d: "".join(f"%{c:02X}" for c in d).encode(),
        "json": lambda d: "".join(f"\\u{c:04x}" for c in d).encode(),
        "html": lambda d: html.escape(d.decode(), quote=True).encode(),
        "htmlnum": lambda d: "".join(f"&#{c};" for c in d).encode(),
    }
    return forms[form](data)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # no 40 ms delayed-ACK stalls between header and body
    log_path = ""

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _record(self) -> dict[str, Any]:
        seen = {
            "method": self.command,
            "path": self.path,
            "host": self.headers.get("host", ""),
            "tls": isinstance(self.connection, ssl.SSLSocket),
            "sni": getattr(self.connection, "sni", None),
            "headers": {k.lower(): v for k, v in self.headers.items()},
        }
        with _lock, open(self.log_path, "a") as f:
            f.write(json.dumps(seen) + "\n")
        return seen

    def _send(self, body: bytes, content_type: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        seen = self._record()
        path, _, query = self.path.partition("?")
        if path == "/echo":
            self._send(json.dumps(seen).encode())
        elif path == "/echo-big":
            n = int(query.partition("=")[2] or 0)
            unit = json.dumps(seen).encode() + b"\n"
            # an odd pad length so copies of the value land across the proxy's chunk borders
            body = (unit + b"." * 1001) * (n // (len(unit) + 1001) + 1)
            self._send(body, "text/plain")
        elif path == "/ws":
            self._websocket(urllib.parse.parse_qs(query))
        elif path == "/reflect":
            self._reflect(urllib.parse.parse_qs(query))
        elif path.startswith("/bytes/"):
            size = int(path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("content-type", "application/octet-stream")
            self.send_header("content-length", str(size))
            self.end_headers()
            block = b"x" * CHUNK
            left = size
            while left > 0:
                n = min(left, CHUNK)
                self.wfile.write(block[:n])
                left -= n
        else:
            self._send(b'{"ok": true}')

    def _websocket(self, q: dict[str, list[str]]) -> None:
        """A WebSocket that sends the request header h back (in ``form``), in one text
        message, then closes."""
        accept = base64.b64encode(
            hashlib.sha1(self.headers["sec-websocket-key"].encode() + WS_GUID).digest()
        )
        self.send_response(101)
        self.send_header("upgrade", "websocket")
        self.send_header("connection", "Upgrade")
        self.send_header("sec-websocket-accept", accept.decode())
        self.end_headers()
        data = reflect(q["form"][0], (self.headers.get(q["h"][0]) or "").encode())
        size = bytes([len(data)]) if len(data) < 126 else b"\x7e" + len(data).to_bytes(2, "big")
        self.wfile.write(b"\x81" + size + data + b"\x88\x00")
        self.wfile.flush()
        self.close_connection = True

    def _reflect(self, q: dict[str, list[str]]) -> None:
        data = q.get("pre", [""])[0].encode() + (self.headers.get(q["h"][0]) or "").encode()
        form = q["form"][0]
        out = reflect(form, data)
        one_line = out.replace(b"\n", b"")
        body = out + b"\n"
        if "n" in q:  # an odd pad length: copies land across the proxy's chunk borders
            count = int(q["n"][0]) // (len(body) + 1001) + 1
            if "noise" in q:  # that gzip cannot shrink much (a streamed compressed body)
                body = b"".join(body + os.urandom(500).hex().encode() + b"." for _ in range(count))
            else:
                body = (body + b"." * 1001) * count
        self.send_response(200, one_line.decode())
        self.send_header("content-type", "text/plain")
        self.send_header("x-reflect", one_line.decode())
        if "gzip" in q:
            body = gzip.compress(body)
            self.send_header("content-encoding", "gzip")
        if "chunked" in q:  # no length announced: the proxy learns the size as it reads
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(0, len(body), 65536):
                part = body[i : i + 65536]
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.write(b"0\r\n\r\n")
            return
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self._record()
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length)
        self._send(json.dumps({"received": len(body)}).encode())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--cert", required=True)
    p.add_argument("--key", required=True)
    p.add_argument("--log", required=True)
    p.add_argument("--bind", default="0.0.0.0")
    p.add_argument("--http-port", type=int, default=80)
    p.add_argument("--https-port", type=int, default=443)
    p.add_argument("--extra-ports", default="", help="more plain-HTTP ports, comma-separated")
    args = p.parse_args()
    Handler.log_path = args.log
    servers = [ThreadingHTTPServer((args.bind, args.http_port), Handler)]
    for port in filter(None, args.extra_ports.split(",")):
        servers.append(ThreadingHTTPServer((args.bind, int(port)), Handler))
    tls = ThreadingHTTPServer((args.bind, args.https_port), Handler)
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(args.cert, args.key)

    def remember_sni(conn: Any, name: str | None, _ctx: Any) -> None:
        conn.sni = name  # recorded with each request on the connection, and each handshake:
        with _lock, open(args.log + ".sni", "a") as f:
            f.write(f"{name}\n")

    ctx.sni_callback = remember_sni
    tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
    servers.append(tls)
    for s in servers[1:]:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("ready", flush=True)
    servers[0].serve_forever()


if __name__ == "__main__":
    main()
