"""The request middleware around any ASGI app: request ids, body caps, unexpected errors."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI, Request

from shellbox.api import errors
from shellbox.api.middleware import RequestContextMiddleware


def _app() -> FastAPI:
    app = FastAPI()
    errors.install(app)
    app.add_middleware(RequestContextMiddleware, upload_max_bytes=100, max_json_bytes=1000)

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    @app.post("/echo")
    async def echo(body: dict[str, Any]) -> dict[str, Any]:
        return body

    @app.post("/raw")
    async def raw(request: Request) -> dict[str, int]:
        return {"n": len(await request.body())}

    return app


async def test_unexpected_errors_get_the_envelope_and_a_request_id() -> None:
    transport = httpx.ASGITransport(app=_app(), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        r = await http.get("/boom")
        assert r.status_code == 500
        assert r.headers["x-request-id"].startswith("req_")
        assert r.json()["error"]["code"] == "internal_error"
        assert "a bug" not in r.text  # no internals leak


async def test_body_caps_with_and_without_content_length() -> None:
    transport = httpx.ASGITransport(app=_app())
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        assert (await http.post("/echo", json={"a": "x" * 10})).json() == {"a": "x" * 10}
        r = await http.post("/echo", json={"a": "x" * 2000})
        assert r.status_code == 413 and "1000 bytes" in r.json()["error"]["message"]

        async def chunks(n: int = 30) -> Any:  # no content-length: counted as it arrives
            for _ in range(n):
                yield b"x" * 100

        for path in ("/echo", "/raw"):
            r = await http.post(
                path, content=chunks(), headers={"content-type": "application/json"}
            )
            assert r.status_code == 413, (path, r.text)
            assert r.json()["error"]["code"] == "payload_too_large"
            assert "x-request-id" in r.headers
        r = await http.post(
            "/raw",
            content=chunks(1000),  # past the upload cap plus the multipart allowance
            headers={"content-type": "multipart/form-data; boundary=b"},
        )
        assert r.status_code == 413 and "upload" in r.json()["error"]["message"]
