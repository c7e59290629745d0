"""``RemoteRuntime``: the ``Runtime`` of a ``shellbox node`` on another machine, over HTTP.

Every protocol method is one ``POST /v1/runtime/<method>`` on the node (``shellbox.node``),
with the cluster key as a bearer token. Arguments and results are JSON (``wire.py``);
bodies are streamed both ways, never buffered whole: a file or an archive to write is the
request body (the arguments then go in the ``shellbox-args`` header), a file or an archive
read is the response body, and a command's events arrive as NDJSON lines while it runs.

Errors the node's driver raises come back as the same ``ShellboxError`` class (``wire.py``),
so the API answers them exactly as with a local runtime. A node that cannot be reached
(refused, unreachable within ``connect_timeout_s``, cut off mid-answer) is a
``NodeUnavailable``: a 503 naming the node, never a hang and never a 500.
"""

from __future__ import annotations

import builtins
import json
import os
import ssl
import stat
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import anyio
import httpx
from anyio.abc import ByteStream
from websockets.asyncio.client import ClientConnection

from shellbox.errors import InvalidRequest, NodeUnavailable, SandboxError, ShellboxError
from shellbox.patch import PatchOperation
from shellbox.sandbox import wire
from shellbox.sandbox.base import (
    ByteSource,
    CommandFinished,
    CommandResult,
    ContainerSpec,
    ExecEvent,
    ExecRequest,
    FileInfo,
    PatchResult,
    PtyRequest,
    PtySession,
    RecoveryAction,
    Runtime,
    RuntimeInfo,
    SandboxInfo,
    SandboxState,
    SnapshotTaken,
)
from shellbox.sandbox.remote_streams import RemoteByteStream, RemotePty, dial, open_websocket

ARGS_HEADER = "shellbox-args"  # must match shellbox/node/app.py
PREFIX = "/v1/runtime/"  # must match shellbox/node/app.py


def read_private_file(path: Path, what: str) -> str:
    """The text of ``path``, which must be a regular file its owner alone may read (0600 or
    stricter): a cluster key or a TLS private key readable by others would let any local user
    drive every sandbox of the cluster, or pose as its node."""
    try:
        st = os.stat(path)
        text = path.read_text()
    except OSError as exc:
        msg = f"{what} {path}: {exc.strerror}"
        raise SandboxError(msg) from None
    if not stat.S_ISREG(st.st_mode) or st.st_mode & 0o077:
        msg = f"{what} {path} must be a regular file readable by its owner only (0600)"
        raise SandboxError(msg)
    return text


def load_cluster_key(path: Path) -> str:
    """The cluster key in ``path`` (root's alone: ``read_private_file``)."""
    key = read_private_file(path, "cluster key file").strip()
    if len(key) < 16:
        msg = f"cluster key file {path} holds no key of at least 16 characters"
        raise SandboxError(msg)
    return key


async def _async_body(chunks: ByteSource) -> AsyncIterator[bytes]:
    """A body as the async stream httpx sends; a sync one is read in a worker thread (it may
    block: a file, a tar being made)."""
    if isinstance(chunks, AsyncIterable):
        async for chunk in chunks:
            yield chunk
        return
    it = iter(chunks)

    def pull() -> bytes | None:
        return next(it, None)

    while True:
        pulled: bytes | None = await anyio.to_thread.run_sync(pull)
        if pulled is None:
            return
        yield pulled


class RemoteRuntime:
    """A ``Runtime`` whose sandboxes run on the node at ``base_url``."""

    def __init__(
        self,
        base_url: str,
        cluster_key: str,
        *,
        name: str | None = None,
        connect_timeout_s: float = 3.0,
        timeout_s: float = 600.0,
        ca_file: Path | None = None,
    ) -> None:
        """``ca_file``: the CA certificates an https node is checked against (default: the
        system's trust store); the WebSockets of terminals and ports are checked the same."""
        self.base_url = base_url.rstrip("/")
        self.name = name or urlsplit(self.base_url).netloc or self.base_url
        self._headers = {"authorization": f"Bearer {cluster_key}"}
        self._connect_timeout_s = connect_timeout_s
        self._call_timeout_s = timeout_s
        # A call may take as long as the node's work (a fork of a large disk, an agent's
        # start); reaching the node may not.
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        https = urlsplit(self.base_url).scheme == "https"
        self._tls = ssl.create_default_context(cafile=ca_file) if https else None
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=self._headers,
            timeout=self._timeout,
            verify=self._tls or True,
        )
        self._info: RuntimeInfo | None = None

    async def aclose(self) -> None:
        await self._client.aclose()

    # -- transport --------------------------------------------------------------------------

    def _unavailable(self, exc: BaseException) -> NodeUnavailable:
        cause: BaseException | None = exc
        while cause is not None:  # httpx wraps the ssl module's error
            if isinstance(cause, ssl.SSLCertVerificationError):
                msg = (
                    f"the node {self.name} is unavailable: its TLS certificate is not trusted "
                    f"({cause.verify_message}); give the replicas its CA in "
                    "cluster.node_ca_file"
                )
                return NodeUnavailable(msg)
            cause = cause.__cause__ or cause.__context__
        msg = (
            f"the node {self.name} is unavailable ({type(exc).__name__}); its containers "
            "answer again once it is back"
        )
        return NodeUnavailable(msg)

    def _error(self, response: httpx.Response, body: bytes) -> ShellboxError:
        return self._refused(response.status_code, body)

    def _refused(self, status: int, body: bytes) -> ShellboxError:
        if status == 401:
            msg = f"the node {self.name} refused the cluster key"
            return SandboxError(msg)
        try:
            raw = json.loads(body)
        except ValueError:
            raw = None
        if raw is None and status in (502, 503, 504):  # a proxy in between
            return self._unavailable(RuntimeError(f"HTTP {status}"))
        return wire.error_from_json(raw, status)

    async def _call(self, method: str, args: Mapping[str, Any]) -> Any:
        try:
            response = await self._client.post(PREFIX + method, json=dict(args))
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from None
        if response.status_code != 200:
            raise self._error(response, response.content)
        return response.json()["result"]

    async def _open(
        self,
        method: str,
        args: Mapping[str, Any],
        *,
        body: ByteSource | None = None,
        read_timeout: bool = True,
    ) -> httpx.Response:
        """A streamed response (the caller closes it)."""
        timeout = (
            self._timeout if read_timeout else httpx.Timeout(None, connect=self._timeout.connect)
        )
        if body is None:
            request = self._client.build_request(
                "POST", PREFIX + method, json=dict(args), timeout=timeout
            )
        else:
            request = self._client.build_request(
                "POST",
                PREFIX + method,
                content=_async_body(body),
                headers={
                    ARGS_HEADER: json.dumps(dict(args)),
                    "content-type": "application/octet-stream",
                },
                timeout=timeout,
            )
        try:
            response = await self._client.send(request, stream=True)
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from None
        if response.status_code != 200:
            try:
                data = await response.aread()
            except httpx.TransportError as exc:
                raise self._unavailable(exc) from None
            finally:
                await response.aclose()
            raise self._error(response, data)
        return response

    async def _send_body(self, method: str, args: Mapping[str, Any], body: ByteSource) -> Any:
        response = await self._open(method, args, body=body)
        try:
            data = await response.aread()
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from None
        finally:
            await response.aclose()
        return json.loads(data)["result"]

    async def _websocket(self, method: str, args: Mapping[str, Any]) -> ClientConnection:
        """A WebSocket to the node's ``method`` (``remote_streams.py`` says why and how): the
        node answers only once the call is made, and a refusal is raised as its class."""
        parts = urlsplit(self.base_url)
        host = parts.hostname or "localhost"
        port = parts.port or (443 if self._tls else 80)
        try:
            sock = await dial(host, port, self._connect_timeout_s)
        except (OSError, TimeoutError) as exc:
            raise self._unavailable(exc) from None
        url = f"{'wss' if self._tls else 'ws'}://{parts.netloc}{parts.path}{PREFIX}{method}"
        headers = {**self._headers, ARGS_HEADER: json.dumps(dict(args))}
        # The handshake waits for the node's call (a terminal may restart its container):
        # as long as any call may take, not only the connect timeout.
        try:
            return await open_websocket(
                url,
                sock,
                headers,
                open_timeout_s=self._call_timeout_s,
                refused=self._refused,
                tls=self._tls,
                server_hostname=host,
            )
        except (OSError, TimeoutError, EOFError) as exc:
            raise self._unavailable(exc) from None

    async def _bytes(self, response: httpx.Response) -> AsyncIterator[bytes]:
        try:
            async for chunk in response.aiter_raw():
                yield chunk
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from None
        finally:
            await response.aclose()

    # -- lifecycle ------------------------------------------------------------------------

    @staticmethod
    def _spec(spec: ContainerSpec) -> dict[str, Any]:
        if spec.mounts:
            msg = "a spec for a node may not bind host paths (mounts): name skills and files"
            raise InvalidRequest(msg, param="mounts")
        return wire.spec_to_json(spec)

    async def create(self, spec: ContainerSpec) -> None:
        await self._call("create", {"spec": self._spec(spec)})

    async def update(self, spec: ContainerSpec) -> None:
        await self._call("update", {"spec": self._spec(spec)})

    async def start(self, container_id: str) -> None:
        await self._call("start", {"container_id": container_id})

    async def responsive(self, container_id: str) -> bool:
        return bool(await self._call("responsive", {"container_id": container_id}))

    async def pause(self, container_id: str) -> None:
        await self._call("pause", {"container_id": container_id})

    async def resume(self, container_id: str) -> None:
        await self._call("resume", {"container_id": container_id})

    async def snapshot(self, container_id: str, snapshot_id: str) -> SnapshotTaken:
        args = {"container_id": container_id, "snapshot_id": snapshot_id}
        return wire.snapshot_from_json(await self._call("snapshot", args))

    async def fork(self, spec: ContainerSpec, snapshot_id: str) -> None:
        await self._call("fork", {"spec": self._spec(spec), "snapshot_id": snapshot_id})

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await self._call("delete_snapshot", {"snapshot_id": snapshot_id})

    async def snapshot_ids(self) -> builtins.list[str]:
        return [str(s) for s in await self._call("snapshot_ids", {})]

    async def stop(self, container_id: str) -> None:
        await self._call("stop", {"container_id": container_id})

    async def destroy(self, container_id: str) -> None:
        await self._call("destroy", {"container_id": container_id})

    async def state(self, container_id: str) -> SandboxState:
        result: SandboxState = await self._call("state", {"container_id": container_id})
        return result

    async def list(self) -> builtins.list[SandboxInfo]:
        return [wire.sandbox_info_from_json(i) for i in await self._call("list", {})]

    async def recover(self) -> dict[str, RecoveryAction]:
        result: dict[str, RecoveryAction] = await self._call("recover", {})
        return result

    def describe(self) -> RuntimeInfo:
        """What the node runs; asked once (a blocking round trip the first time)."""
        if self._info is None:
            timeout = httpx.Timeout(30.0, connect=self._connect_timeout_s)
            try:
                response = httpx.post(
                    self.base_url + PREFIX + "describe",
                    json={},
                    headers=self._headers,
                    timeout=timeout,
                )
            except httpx.TransportError as exc:
                raise self._unavailable(exc) from None
            if response.status_code != 200:
                raise self._error(response, response.content)
            self._info = wire.runtime_info_from_json(response.json()["result"])
        return self._info

    async def image_file(self, path: str) -> bytes | None:
        result = await self._call("image_file", {"path": path})
        return None if result is None else bytes.fromhex(result)

    # -- skills -----------------------------------------------------------------------------

    async def install_skill(self, key: str, archive: ByteSource) -> bool:
        if await self._call("skill_held", {"key": key}):
            return False  # (its archive is not read: made as it is sent)
        return bool(await self._send_body("install_skill", {"key": key}, archive))

    async def skill_keys(self) -> builtins.list[str]:
        return [str(k) for k in await self._call("skill_keys", {})]

    async def remove_skill(self, key: str) -> None:
        await self._call("remove_skill", {"key": key})

    async def memory_usage(self, container_id: str) -> int | None:
        used = await self._call("memory_usage", {"container_id": container_id})
        return None if used is None else int(used)

    # -- services inside ----------------------------------------------------------------

    async def connect_port(self, container_id: str, port: int) -> ByteStream:
        args = {"container_id": container_id, "port": port}
        return RemoteByteStream(await self._websocket("connect_port", args))

    # -- commands -------------------------------------------------------------------------

    async def pty(self, container_id: str, request: PtyRequest) -> PtySession:
        args = {"container_id": container_id, "request": wire.pty_request_to_json(request)}
        return RemotePty(await self._websocket("pty", args))

    async def exec(self, container_id: str, request: ExecRequest) -> AsyncIterator[ExecEvent]:
        args = {"container_id": container_id, "request": wire.request_to_json(request)}
        # No read timeout: a command may be silent for as long as its own timeout_ms.
        response = await self._open("exec", args, read_timeout=False)
        try:
            async for line in response.aiter_lines():
                if not line:
                    continue
                raw = json.loads(line)
                if "error" in raw:
                    raise wire.error_from_json(raw, 500)
                yield wire.event_from_json(raw)
        except httpx.TransportError as exc:
            raise self._unavailable(exc) from None
        finally:
            await response.aclose()

    async def run(self, container_id: str, request: ExecRequest) -> builtins.list[CommandResult]:
        results: builtins.list[CommandResult] = []
        async for event in self.exec(container_id, _unstreamed(request)):
            if isinstance(event, CommandFinished):
                results.append(event.result)
        return results

    # -- files ----------------------------------------------------------------------------

    async def read_file(
        self, container_id: str, rel: str, *, follow_links: bool = False, param: str = "path"
    ) -> AsyncIterator[bytes]:
        args = {"container_id": container_id, "rel": rel, "follow_links": follow_links,
                "param": param}  # fmt: skip
        return self._bytes(await self._open("read_file", args))

    async def write_file(
        self,
        container_id: str,
        rel: str,
        chunks: ByteSource,
        *,
        follow_links: bool = False,
        param: str = "path",
    ) -> tuple[str, int]:
        args = {"container_id": container_id, "rel": rel, "follow_links": follow_links,
                "param": param}  # fmt: skip
        where, size = await self._send_body("write_file", args, chunks)
        return str(where), int(size)

    async def stat_file(self, container_id: str, rel: str) -> FileInfo | None:
        result = await self._call("stat_file", {"container_id": container_id, "rel": rel})
        return None if result is None else wire.file_info_from_json(result)

    async def list_files(self, container_id: str) -> builtins.list[FileInfo]:
        found = await self._call("list_files", {"container_id": container_id})
        return [wire.file_info_from_json(f) for f in found]

    async def remove_file(self, container_id: str, rel: str, *, param: str = "path") -> None:
        await self._call("remove_file", {"container_id": container_id, "rel": rel, "param": param})

    async def resolve_path(self, container_id: str, rel: str, *, param: str = "path") -> str:
        args = {"container_id": container_id, "rel": rel, "param": param}
        return str(await self._call("resolve_path", args))

    async def apply_patch(
        self, container_id: str, operations: Sequence[PatchOperation]
    ) -> PatchResult:
        args = {"container_id": container_id, "operations": wire.operations_to_json(operations)}
        return wire.patch_result_from_json(await self._call("apply_patch", args))

    async def export_archive(
        self, container_id: str, rel_dir: str, exclude: Sequence[str], *, timeout_ms: int
    ) -> AsyncIterator[bytes]:
        args = {"container_id": container_id, "rel_dir": rel_dir, "exclude": list(exclude),
                "timeout_ms": timeout_ms}  # fmt: skip
        return self._bytes(await self._open("export_archive", args))

    async def import_archive(
        self, container_id: str, rel_dir: str, body: ByteSource, *, timeout_ms: int
    ) -> int:
        args = {"container_id": container_id, "rel_dir": rel_dir, "timeout_ms": timeout_ms}
        return int(await self._send_body("import_archive", args, body))

    async def sweep_uploads(self, container_id: str) -> int:
        return int(await self._call("sweep_uploads", {"container_id": container_id}))


def _unstreamed(request: ExecRequest) -> ExecRequest:
    from dataclasses import replace

    return replace(request, stream=False)


if TYPE_CHECKING:  # mypy checks that it is a whole ``Runtime``

    def _is_a_runtime(rt: RemoteRuntime) -> Runtime:
        return rt
