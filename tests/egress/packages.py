"""A tiny npm registry and a tiny PEP 503 package index, for ``upstream.py``: one package
each, built in memory, so the egress tests can ``npm install`` and ``pip install`` through the
proxy without the internet.

    /npm/shellbox-hello                       the npm packument (metadata)
    /npm/shellbox-hello/-/shellbox-hello-1.0.0.tgz
    /simple/shellbox-hello/                   the PEP 503 project page
    /files/shellbox_hello-1.0.0-py3-none-any.whl
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import tarfile
import zipfile

NAME = "shellbox-hello"
VERSION = "1.0.0"
GREETING = "hello from the local index"
TGZ = f"{NAME}-{VERSION}.tgz"
WHEEL = f"shellbox_hello-{VERSION}-py3-none-any.whl"


def npm_tarball() -> bytes:
    files = {
        "package/package.json": json.dumps(
            {"name": NAME, "version": VERSION, "main": "index.js"}
        ).encode(),
        "package/index.js": f"module.exports = {json.dumps(GREETING)};\n".encode(),
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def wheel() -> bytes:
    dist = f"shellbox_hello-{VERSION}.dist-info"
    files = {
        "shellbox_hello.py": f"GREETING = {GREETING!r}\n".encode(),
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: shellbox-tests\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


TARBALL_BYTES = npm_tarball()
WHEEL_BYTES = wheel()


def route(path: str, host: str) -> tuple[bytes, str] | None:
    """The body and content type for ``path`` on ``host``, or None when it is not ours."""
    if path == f"/npm/{NAME}":
        integrity = "sha512-" + base64.b64encode(hashlib.sha512(TARBALL_BYTES).digest()).decode()
        packument = {
            "name": NAME,
            "dist-tags": {"latest": VERSION},
            "versions": {
                VERSION: {
                    "name": NAME,
                    "version": VERSION,
                    "main": "index.js",
                    "dist": {
                        "tarball": f"https://{host}/npm/{NAME}/-/{TGZ}",
                        "integrity": integrity,
                        "shasum": hashlib.sha1(TARBALL_BYTES).hexdigest(),
                    },
                }
            },
        }
        return json.dumps(packument).encode(), "application/json"
    if path == f"/npm/{NAME}/-/{TGZ}":
        return TARBALL_BYTES, "application/octet-stream"
    if path in (f"/simple/{NAME}/", f"/simple/{NAME}"):
        digest = hashlib.sha256(WHEEL_BYTES).hexdigest()
        page = f'<!DOCTYPE html><html><body><a href="/files/{WHEEL}#sha256={digest}">{WHEEL}</a>'
        return (page + "</body></html>\n").encode(), "text/html"
    if path == f"/files/{WHEEL}":
        return WHEEL_BYTES, "application/octet-stream"
    return None
