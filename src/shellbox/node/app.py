"""The node's HTTP server: the ``Runtime`` protocol of this machine, for API servers that
present the cluster key.

One route, ``POST /v1/runtime/{method}``, dispatched through a table with one entry per
protocol method: the wire names are the protocol's own, so a method added to ``Runtime`` is
one line here and one in ``RemoteRuntime``, and the table is the list of what a caller may
do (nothing else of the driver is reachable). Arguments are a JSON body, or the
``shellbox-args`` header when the body is a byte stream (``write_file``, ``import_archive``,
``install_skill``); results are ``{"result": ...}``, a byte stream (``read_file``,
``export_archive``) or NDJSON events (``exec``). A ``ShellboxError`` answers its status with
``wire.error_to_json`` (the class crosses, ``RemoteRuntime`` raises it again); anything else
is logged and answered 500. The byte streams (``connect_port``, ``pty``) are a WebSocket on
the same path (``GET``; ``shellbox.sandbox.remote_streams`` says why and how), relayed by
``streams.py``. ``GET /healthz`` needs no key (a readiness probe) and says only the node's
name.

Specs from the wire may not carry ``mounts``: a caller names skills and files by value and
never a path of this machine. Paths under ``/mnt/data`` must come normalised, as the
protocol says (``datapath.relative_path``: no ``..``, no absolute path), since the driver's
walk relies on it; ``resolve_path`` alone takes links and ``..`` (it resolves them inside).
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from shellbox.errors import InvalidRequest, PayloadTooLarge, SandboxError, ShellboxError
from shellbox.node.info import NodeInfo
from shellbox.node.streams import relay_port, relay_pty
from shellbox.sandbox import ContainerSpec, Runtime, RuntimeInfo, wire
from shellbox.sandbox.datapath import relative_path
from shellbox.sandbox.remote import ARGS_HEADER
from shellbox.sandbox.remote_streams import BROKEN

log = logging.getLogger("shellbox.node")
MAX_ARGS_BYTES = 16 << 20  # a JSON body (a spec, a patch); bytes stream separately

Args = Mapping[str, Any]
Unary = Callable[[Runtime, Args], Awaitable[Any]]


def _spec(raw: Any) -> ContainerSpec:
    spec = wire.spec_from_json(raw)
    if spec.mounts:
        msg = "a spec from the network may not bind host paths (mounts)"
        raise InvalidRequest(msg, param="spec.mounts")
    return spec


def _rel(a: Args, name: str = "rel", *, allow_root: bool = False) -> str:
    """A path argument, which must already be normalised (``""``: /mnt/data itself)."""
    raw = a[name]
    if not isinstance(raw, str):
        msg = f"{name} must be a string"
        raise InvalidRequest(msg, param=name)
    if raw == "" and allow_root:
        return raw
    if relative_path(raw, param=str(a.get("param", name))) != raw:
        msg = f"{name} {raw[:200]!r} is not a normalised path under /mnt/data"
        raise InvalidRequest(msg, param=str(a.get("param", name)))
    return raw


async def _image_file(rt: Runtime, a: Args) -> str | None:
    data = await rt.image_file(a["path"])
    return None if data is None else data.hex()


async def _describe(rt: Runtime, a: Args) -> RuntimeInfo:
    return rt.describe()


async def _skill_held(rt: Runtime, a: Args) -> bool:
    return a["key"] in await rt.skill_keys()


UNARY: dict[str, Unary] = {
    "create": lambda rt, a: rt.create(_spec(a["spec"])),
    "update": lambda rt, a: rt.update(_spec(a["spec"])),
    "start": lambda rt, a: rt.start(a["container_id"]),
    "responsive": lambda rt, a: rt.responsive(a["container_id"]),
    "pause": lambda rt, a: rt.pause(a["container_id"]),
    "resume": lambda rt, a: rt.resume(a["container_id"]),
    "snapshot": lambda rt, a: rt.snapshot(a["container_id"], a["snapshot_id"]),
    "fork": lambda rt, a: rt.fork(_spec(a["spec"]), a["snapshot_id"]),
    "delete_snapshot": lambda rt, a: rt.delete_snapshot(a["snapshot_id"]),
    "snapshot_ids": lambda rt, a: rt.snapshot_ids(),
    "stop": lambda rt, a: rt.stop(a["container_id"]),
    "destroy": lambda rt, a: rt.destroy(a["container_id"]),
    "state": lambda rt, a: rt.state(a["container_id"]),
    "list": lambda rt, a: rt.list(),
    "recover": lambda rt, a: rt.recover(),
    "describe": _describe,
    "image_file": _image_file,
    "skill_held": _skill_held,
    "skill_keys": lambda rt, a: rt.skill_keys(),
    "remove_skill": lambda rt, a: rt.remove_skill(a["key"]),
    "stat_file": lambda rt, a: rt.stat_file(a["container_id"], _rel(a)),
    "list_files": lambda rt, a: rt.list_files(a["container_id"]),
    "remove_file": lambda rt, a: rt.remove_file(a["container_id"], _rel(a), param=a["param"]),
    "resolve_path": lambda rt, a: rt.resolve_path(a["container_id"], a["rel"], param=a["param"]),
    "apply_patch": lambda rt, a: rt.apply_patch(
        a["container_id"], wire.operations_from_json(a["operations"])
    ),
    "sweep_uploads": lambda rt, a: rt.sweep_uploads(a["container_id"]),
    "memory_usage": lambda rt, a: rt.memory_usage(a["container_id"]),
}


def _port(a: Args) -> int:
    port = a["port"]
    if type(port) is not int or not 1 <= port <= 65535:
        msg = f"port must be an integer from 1 to 65535, not {port!r}"
        raise InvalidRequest(msg, param="port")
    return port


def _error(exc: ShellboxError) -> JSONResponse:
    return JSONResponse(wire.error_to_json(exc), status_code=exc.status)


async def _refuse(websocket: WebSocket, exc: ShellboxError) -> None:
    """The error as the answer to the handshake; once the socket is open (the relay failed),
    a broken close."""
    if websocket.application_state == WebSocketState.CONNECTING:
        await websocket.send_denial_response(_error(exc))
        return
    log.warning("node stream failed after it opened: %s", exc)
    if websocket.application_state == WebSocketState.CONNECTED:
        with contextlib.suppress(WebSocketDisconnect, OSError, RuntimeError):
            await websocket.close(BROKEN)


def create_node_app(
    runtime: Runtime,
    cluster_key: str,
    info: NodeInfo,
    *,
    on_start: Callable[[], Awaitable[None]] | None = None,
    on_stop: Callable[[], Awaitable[None]] | None = None,
) -> Starlette:
    """The node's application. ``on_start``/``on_stop``: the node's own start-up and
    shutdown (its egress network; registration in the cluster's database)."""
    expected = f"Bearer {cluster_key}".encode()

    def authorized(request: Request | WebSocket) -> bool:
        given = request.headers.get("authorization", "").encode()
        return hmac.compare_digest(given, expected)

    async def args_of(request: Request, *, streamed: bool) -> dict[str, Any]:
        if streamed:
            raw = request.headers.get(ARGS_HEADER, "{}").encode()
        else:
            if int(request.headers.get("content-length") or 0) > MAX_ARGS_BYTES:
                msg = f"the arguments are larger than {MAX_ARGS_BYTES} bytes"
                raise PayloadTooLarge(msg)
            raw = await request.body()
        try:
            args = json.loads(raw or b"{}")
        except ValueError:
            msg = "the arguments are not JSON"
            raise InvalidRequest(msg) from None
        if not isinstance(args, dict):
            msg = "the arguments must be a JSON object"
            raise InvalidRequest(msg)
        return args

    async def call(request: Request) -> Response:
        if not authorized(request):
            error = {"message": "a valid cluster key is required", "type": "invalid_request_error",
                     "param": None, "code": "invalid_api_key"}  # fmt: skip
            return JSONResponse({"error": error}, status_code=401)
        method = request.path_params["method"]
        try:
            return await dispatch(request, method)
        except ShellboxError as exc:
            return _error(exc)
        except ClientDisconnect:
            log.info("node call %s: the caller went away mid-body", method)
            return Response(status_code=499)
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"{method}: bad arguments ({type(exc).__name__}: {exc})"
            return _error(InvalidRequest(msg))
        except Exception:
            log.exception("node call %s failed", method)
            return _error(SandboxError(f"the node failed in {method}; see its log"))

    async def dispatch(request: Request, method: str) -> Response:
        rt = runtime
        unary = UNARY.get(method)
        if unary is not None:
            args = await args_of(request, streamed=False)
            result = await unary(rt, args)
            return JSONResponse({"result": wire.value_to_json(result)})
        if method == "exec":
            args = await args_of(request, streamed=False)
            return StreamingResponse(
                _events(rt, args["container_id"], wire.request_from_json(args["request"])),
                media_type="application/x-ndjson",
            )
        if method == "read_file":
            args = await args_of(request, streamed=False)
            stream = await rt.read_file(
                args["container_id"], _rel(args), follow_links=bool(args["follow_links"]),
                param=args["param"],
            )  # fmt: skip
            return StreamingResponse(stream, media_type="application/octet-stream")
        if method == "export_archive":
            args = await args_of(request, streamed=False)
            stream = await rt.export_archive(
                args["container_id"], _rel(args, "rel_dir", allow_root=True), list(args["exclude"]),
                timeout_ms=int(args["timeout_ms"]),
            )  # fmt: skip
            return StreamingResponse(stream, media_type="application/x-tar")
        if method == "write_file":
            args = await args_of(request, streamed=True)
            where, size = await rt.write_file(
                args["container_id"], _rel(args), request.stream(),
                follow_links=bool(args["follow_links"]), param=args["param"],
            )  # fmt: skip
            return JSONResponse({"result": [where, size]})
        if method == "import_archive":
            args = await args_of(request, streamed=True)
            size = await rt.import_archive(
                args["container_id"], _rel(args, "rel_dir", allow_root=True), request.stream(),
                timeout_ms=int(args["timeout_ms"]),
            )  # fmt: skip
            return JSONResponse({"result": size})
        if method == "install_skill":
            args = await args_of(request, streamed=True)
            done = await rt.install_skill(args["key"], request.stream())
            return JSONResponse({"result": done})
        msg = f"the node has no method {method!r}"
        raise InvalidRequest(msg, param="method")

    async def stream(websocket: WebSocket) -> None:
        """``connect_port`` and ``pty`` (``remote_streams.py``): the call is made before the
        socket is accepted, so a refusal is an HTTP answer the caller raises as its class."""
        method = websocket.path_params["method"]
        if not authorized(websocket):
            error = {"message": "a valid cluster key is required", "type": "invalid_request_error",
                     "param": None, "code": "invalid_api_key"}  # fmt: skip
            await websocket.send_denial_response(JSONResponse({"error": error}, status_code=401))
            return
        try:
            raw = json.loads(websocket.headers.get(ARGS_HEADER, "{}"))
            if not isinstance(raw, dict):
                msg = "the arguments must be a JSON object"
                raise InvalidRequest(msg)
            if method == "connect_port":
                port_stream = await runtime.connect_port(raw["container_id"], _port(raw))
                await websocket.accept()
                await relay_port(websocket, port_stream)
            elif method == "pty":
                request = wire.pty_request_from_json(raw["request"])
                session = await runtime.pty(raw["container_id"], request)
                await websocket.accept()
                await relay_pty(websocket, session)
            else:
                msg = f"the node has no stream method {method!r}"
                raise InvalidRequest(msg, param="method")
        except ShellboxError as exc:
            await _refuse(websocket, exc)
        except (KeyError, TypeError, ValueError) as exc:
            msg = f"{method}: bad arguments ({type(exc).__name__}: {exc})"
            await _refuse(websocket, InvalidRequest(msg))
        except Exception:
            log.exception("node stream %s failed", method)
            await _refuse(websocket, SandboxError(f"the node failed in {method}; see its log"))

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok", "node": info.name})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        if on_start is not None:
            await on_start()
        try:
            yield
        finally:
            if on_stop is not None:
                await on_stop()

    return Starlette(
        routes=[
            Route("/v1/runtime/{method}", call, methods=["POST"]),
            WebSocketRoute("/v1/runtime/{method}", stream),
            Route("/healthz", healthz, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


async def _events(rt: Runtime, container_id: str, request: Any) -> AsyncIterator[bytes]:
    """A command's events as NDJSON; an error (before or while it runs) is the last line."""
    try:
        async for event in rt.exec(container_id, request):
            yield (json.dumps(wire.event_to_json(event)) + "\n").encode()
    except ShellboxError as exc:
        yield (json.dumps(wire.error_to_json(exc)) + "\n").encode()
    except Exception:
        log.exception("node exec in %s failed", container_id)
        error = SandboxError(f"the node failed running commands in {container_id}; see its log")
        yield (json.dumps(wire.error_to_json(error)) + "\n").encode()
