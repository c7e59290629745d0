"""A stand-in for the internet: an HTTP and HTTPS server the egress tests run inside a network
namespace of their own (``python upstream.py --cert C --key K --log L``).

Routes (any host name, the certificate carries the test names):
    /echo            JSON of the request as received: method, path, headers
    /echo-big?n=N    the same JSON, repeated, padded to more than N bytes (a streamed body)
    /bytes/N         N bytes of b"x" (downloads)
    /npm/..., /simple/..., /files/...   one npm package and one wheel (see packages.py)
Every request's method, host, path and headers are appended to the JSON-lines ``--log``, so a
test can see what reached the upstream.
"""

from __future__ import annotations

import argparse
import json
import ssl
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import packages  # beside this script

CHUNK = 256 * 1024
_lock = threading.Lock()


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
        elif (package := packages.route(path, seen["host"])) is not None:
            self._send(*package)
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
    tls.socket = ctx.wrap_socket(tls.socket, server_side=True)
    servers.append(tls)
    for s in servers[1:]:
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("ready", flush=True)
    servers[0].serve_forever()


if __name__ == "__main__":
    main()
