"""Runs inside a sandbox (stdlib only: the image has no WebSocket library): an HTTP server on
127.0.0.1:PORT that describes each request it gets as JSON, streams ``/stream`` until
``/release`` is asked for, and echoes WebSocket messages (RFC 6455, unfragmented frames).

    python3 echo_server.py PORT
"""

import base64
import hashlib
import json
import struct
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
released = threading.Event()


def read_exact(f, n):
    data = f.read(n)
    if len(data) < n:
        raise EOFError
    return data


def read_frame(f):
    b0, b1 = read_exact(f, 2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack(">H", read_exact(f, 2))[0]
    elif n == 127:
        n = struct.unpack(">Q", read_exact(f, 8))[0]
    mask = read_exact(f, 4) if b1 & 0x80 else b"\0\0\0\0"
    data = bytes(b ^ mask[i % 4] for i, b in enumerate(read_exact(f, n)))
    return b0 & 0x0F, data


def send_frame(f, opcode, data):
    head = bytes([0x80 | opcode])
    if len(data) < 126:
        head += bytes([len(data)])
    elif len(data) < 65536:
        head += bytes([126]) + struct.pack(">H", len(data))
    else:
        head += bytes([127]) + struct.pack(">Q", len(data))
    f.write(head + data)
    f.flush()


def read_chunked(f):
    body = b""
    while True:
        size = int(f.readline().split(b";")[0], 16)
        if size == 0:
            f.readline()
            return body
        body += read_exact(f, size)
        f.readline()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_GET(self):
        if self.headers.get("Upgrade", "").lower() == "websocket":
            return self.websocket()
        if self.path.startswith("/stream"):
            return self.stream()
        if self.path.startswith("/release"):
            released.set()
        if self.path.startswith("/redirect"):
            self.send_response(302)
            self.send_header("Location", "/target?x=1")
            self.send_header("Set-Cookie", "sid=abc; Path=/; Domain=example.com; HttpOnly")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.describe(b"")

    def do_POST(self):
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            body = read_chunked(self.rfile)
        else:
            body = read_exact(self.rfile, int(self.headers.get("Content-Length") or 0))
        self.describe(body)

    do_PUT = do_PATCH = do_DELETE = do_POST

    def describe(self, body):
        out = json.dumps(
            {
                "method": self.command,
                "path": self.path,
                "headers": [[k.lower(), v] for k, v in self.headers.items()],
                "body_bytes": len(body),
                "body_sha256": hashlib.sha256(body).hexdigest(),
            }
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.send_header("X-Echo", "yes")
        self.end_headers()
        self.wfile.write(out)

    def stream(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for part in (b"first\n", None, b"last\n"):
            if part is None:
                released.wait(60)
                continue
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")

    def websocket(self):
        key = self.headers["Sec-WebSocket-Key"].encode()
        accept = base64.b64encode(hashlib.sha1(key + GUID).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        offered = self.headers.get("Sec-WebSocket-Protocol")
        if offered:
            self.send_header("Sec-WebSocket-Protocol", offered.split(",")[0].strip())
        self.end_headers()
        self.close_connection = True
        while True:
            try:
                opcode, data = read_frame(self.rfile)
            except EOFError:
                return
            if opcode == 8:
                send_frame(self.wfile, 8, data[:2])
                return
            if opcode == 9:
                send_frame(self.wfile, 10, data)
            elif opcode in (1, 2):
                send_frame(self.wfile, opcode, b"echo:" + data)


ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
