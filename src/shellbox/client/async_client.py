"""``AsyncShellbox``: the asyncio client; the same surface as ``Shellbox`` with ``await``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, cast

import httpx

from shellbox.client import terminal, wire
from shellbox.client.errors import InvalidResponseError, status_error, transport_error
from shellbox.client.types import (
    ApplyPatchCallOutput,
    CallDone,
    Container,
    EgressRecord,
    LocalShellCallOutput,
    MountedSkill,
    Page,
    PortLink,
    ShellCallOutput,
    Snapshot,
    StreamEvent,
    WorkspaceFile,
)

if TYPE_CHECKING:
    import openai


class AsyncShellbox:
    """The asyncio twin of ``shellbox.client.Shellbox`` (same arguments, same errors)."""

    def __init__(
        self,
        base_url: str | None = None,
        api_key: str | None = None,
        *,
        timeout: float | httpx.Timeout | None = None,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self._config = wire.ClientConfig.resolve(base_url, api_key, timeout)
        self._http = http_client or httpx.AsyncClient(timeout=self._config.timeout)
        self._owns_http = http_client is None
        self._openai: openai.AsyncOpenAI | None = None
        self.calls = AsyncCalls(self)
        self.egress = AsyncEgress(self)
        self.skills = AsyncSkills(self)
        self.workspace = AsyncWorkspace(self)
        self.containers = AsyncContainers(self)
        self.snapshots = AsyncSnapshots(self)
        self.ports = AsyncPorts(self)

    @property
    def base_url(self) -> str:
        return self._config.base_url

    @property
    def api_key(self) -> str:
        return self._config.api_key

    @property
    def openai(self) -> openai.AsyncOpenAI:
        """An ``openai.AsyncOpenAI`` for the same server and key."""
        if self._openai is None:
            import openai

            self._openai = openai.AsyncOpenAI(
                base_url=self._config.base_url,
                api_key=self._config.api_key,
                timeout=self._config.timeout.read,
            )
        return self._openai

    async def aclose(self) -> None:
        if self._owns_http:
            await self._http.aclose()
        if self._openai is not None:
            await self._openai.close()

    async def __aenter__(self) -> AsyncShellbox:
        return self

    @asynccontextmanager
    async def pty(
        self,
        container_id: str,
        *,
        cols: int = 80,
        rows: int = 24,
        command: str | None = None,
        open_timeout: float = 60.0,
    ) -> AsyncIterator[terminal.AsyncTerminal]:
        """A terminal in the container: the sandbox user's ``bash`` in /mnt/data (or
        ``bash -c command``), closed (and everything it started killed) when the block
        ends. Refusals raise as every call's do (``NotFoundError``, ``RateLimitError``...)."""
        from websockets.asyncio.client import connect
        from websockets.exceptions import InvalidHandshake, InvalidURI

        url = terminal.pty_url(self._config.base_url, container_id, cols, rows, command)
        try:
            ws = await connect(
                url,
                additional_headers=self._config.headers(),
                open_timeout=open_timeout,
                max_size=None,
            )
        except (InvalidHandshake, InvalidURI, OSError, TimeoutError) as exc:
            raise terminal.refusal(exc) from exc
        try:
            yield terminal.AsyncTerminal(ws)
        finally:
            await ws.close()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def port_url(self, container_id: str, port: int, path: str = "/") -> str:
        """The URL of ``path`` (with its query, if any) on the HTTP or WebSocket service that
        listens on ``127.0.0.1:{port}`` inside the container; send the key with it (a
        ``ws://`` URL: replace the scheme). For a browser, make a link: ``ports.create_link``."""
        return self._config.base_url + wire.port_path(container_id, port, path)

    # -- transport --------------------------------------------------------------------------

    async def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Any = None,
        content: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> httpx.Response:
        try:
            response = await self._http.request(
                method,
                self._config.base_url + path,
                json=json,
                params=params,
                content=content,
                headers={**self._config.headers(), **(headers or {})},
            )
        except httpx.TransportError as exc:
            raise transport_error(exc) from exc
        if response.is_error:
            raise status_error(response, response.content)
        return response

    @asynccontextmanager
    async def _stream(
        self, method: str, path: str, *, json: Any = None, params: Any = None
    ) -> AsyncIterator[httpx.Response]:
        try:
            async with self._http.stream(
                method,
                self._config.base_url + path,
                json=json,
                params=params,
                headers=self._config.headers(),
            ) as response:
                if response.is_error:
                    raise status_error(response, await response.aread())
                yield response
        except httpx.TransportError as exc:
            raise transport_error(exc) from exc


class AsyncShellCallStream:
    """The events of one streamed ``shell_call``; iterate it inside its ``async with``."""

    def __init__(self, response: httpx.Response) -> None:
        self._response = response
        self.output: ShellCallOutput | None = None
        self._started = False

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        if self._started:
            msg = "a call's stream can be iterated once"
            raise RuntimeError(msg)
        self._started = True
        decoder = wire.SSEDecoder()
        try:
            async for line in self._response.aiter_lines():
                payload = decoder.feed(line)
                if payload is not None:
                    yield self._seen(wire.stream_event(payload))
            payload = decoder.feed("")
            if payload is not None:
                yield self._seen(wire.stream_event(payload))
        except httpx.TransportError as exc:
            raise transport_error(exc) from exc

    def _seen(self, event: StreamEvent) -> StreamEvent:
        if isinstance(event, CallDone):
            self.output = event.item
        return event

    async def until_done(self) -> ShellCallOutput:
        if not self._started:
            async for _ in self:
                pass
        if self.output is None:
            msg = "the stream ended before the call's output item arrived"
            raise InvalidResponseError(msg)
        return self.output


class AsyncCalls:
    def __init__(self, client: AsyncShellbox) -> None:
        self._client = client

    async def create(self, container_id: str, item: Mapping[str, Any]) -> dict[str, Any]:
        path = wire.container_path(container_id, "calls")
        response = await self._client._request("POST", path, json=item)
        return cast(dict[str, Any], wire.json_body(response))

    async def shell(
        self,
        container_id: str,
        commands: Sequence[str],
        *,
        timeout_ms: int | None = None,
        max_output_length: int | None = None,
        call_id: str | None = None,
    ) -> ShellCallOutput:
        item = wire.shell_call_item(
            commands, timeout_ms=timeout_ms, max_output_length=max_output_length, call_id=call_id
        )
        return ShellCallOutput.from_wire(await self.create(container_id, item))

    @asynccontextmanager
    async def stream_shell(
        self,
        container_id: str,
        commands: Sequence[str],
        *,
        timeout_ms: int | None = None,
        max_output_length: int | None = None,
        call_id: str | None = None,
    ) -> AsyncIterator[AsyncShellCallStream]:
        item = wire.shell_call_item(
            commands, timeout_ms=timeout_ms, max_output_length=max_output_length, call_id=call_id
        )
        path = wire.container_path(container_id, "calls")
        async with self._client._stream(
            "POST", path, json=item, params={"stream": "true"}
        ) as response:
            yield AsyncShellCallStream(response)

    async def local_shell(
        self,
        container_id: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        working_directory: str | None = None,
        timeout_ms: int | None = None,
        user: str | None = None,
        call_id: str | None = None,
    ) -> LocalShellCallOutput:
        item = wire.local_shell_call_item(
            command,
            env=env,
            working_directory=working_directory,
            timeout_ms=timeout_ms,
            user=user,
            call_id=call_id,
        )
        return LocalShellCallOutput.from_wire(await self.create(container_id, item))

    async def apply_patch(
        self, container_id: str, operation: Mapping[str, Any], *, call_id: str | None = None
    ) -> ApplyPatchCallOutput:
        item = wire.apply_patch_call_item(operation, call_id=call_id)
        return ApplyPatchCallOutput.from_wire(await self.create(container_id, item))


class AsyncEgress:
    def __init__(self, client: AsyncShellbox) -> None:
        self._client = client

    async def list(
        self,
        container_id: str,
        *,
        after: str | None = None,
        limit: int | None = None,
        order: str | None = None,
    ) -> Page[EgressRecord]:
        path = wire.container_path(container_id, "egress")
        params = wire.list_params(after, limit, order)
        return wire.page(wire.json_body(await self._client._request("GET", path, params=params)))

    async def list_all(
        self, container_id: str, *, limit: int | None = None, order: str | None = None
    ) -> AsyncIterator[EgressRecord]:
        after: str | None = None
        while True:
            p = await self.list(container_id, after=after, limit=limit, order=order)
            for record in p.data:
                yield record
            after = wire.next_after(p)
            if after is None:
                return


class AsyncSkills:
    def __init__(self, client: AsyncShellbox) -> None:
        self._client = client

    async def list(self, container_id: str) -> list[MountedSkill]:
        path = wire.container_path(container_id, "skills")
        out: list[MountedSkill] = []
        after: str | None = None
        while True:
            params = wire.list_params(after, None, None)
            response = await self._client._request("GET", path, params=params)
            p = wire.page(wire.json_body(response))
            out.extend(p.data)
            after = wire.next_after(p)
            if after is None:
                return out


class AsyncWorkspace:
    def __init__(self, client: AsyncShellbox) -> None:
        self._client = client

    async def read(self, container_id: str, path: str, *, max_bytes: int | None = None) -> bytes:
        params: dict[str, Any] = {"path": path}
        if max_bytes is not None:
            params["max_bytes"] = max_bytes
        url = wire.container_path(container_id, "workspace", "file")
        return (await self._client._request("GET", url, params=params)).content

    async def resolve(self, container_id: str, path: str) -> str:
        """Where ``path`` leads with its symbolic links followed (absolute, in the container);
        BadRequestError with code ``path_outside_workspace`` if a link leads out."""
        url = wire.container_path(container_id, "workspace", "path")
        response = await self._client._request("GET", url, params={"path": path})
        return str(wire.json_body(response)["path"])

    async def write(self, container_id: str, path: str, data: bytes) -> WorkspaceFile:
        url = wire.container_path(container_id, "workspace", "file")
        response = await self._client._request("PUT", url, params={"path": path}, content=data)
        body = wire.json_body(response)
        return WorkspaceFile(str(body["path"]), int(body["bytes"]))

    async def export_archive(
        self, container_id: str, *, path: str | None = None, exclude: Iterable[str] = ()
    ) -> bytes:
        url = wire.container_path(container_id, "workspace", "archive")
        params = wire.workspace_params(path, exclude)
        return (await self._client._request("GET", url, params=params)).content

    async def import_archive(
        self, container_id: str, data: bytes, *, path: str | None = None
    ) -> None:
        url = wire.container_path(container_id, "workspace", "archive")
        params = wire.workspace_params(path)
        headers = {"content-type": "application/x-tar"}
        await self._client._request("PUT", url, params=params, content=data, headers=headers)


class AsyncContainers:
    """Pause and resume a container (create, list and delete are the ``openai`` SDK's:
    ``client.openai.containers``; a fork is ``snapshots.fork``)."""

    def __init__(self, client: AsyncShellbox) -> None:
        self._client = client

    async def pause(self, container_id: str) -> Container:
        """Freeze its processes with their memory (status ``paused``, no CPU used); the next
        call or ``resume`` thaws them where they were."""
        path = wire.container_path(container_id, "pause")
        return Container.from_wire(wire.json_body(await self._client._request("POST", path)))

    async def resume(self, container_id: str) -> Container:
        path = wire.container_path(container_id, "resume")
        return Container.from_wire(wire.json_body(await self._client._request("POST", path)))


class AsyncSnapshots:
    """A container's writable state saved (``POST /v1/containers/{id}/snapshots``), listed,
    read and deleted (``/v1/snapshots``), and forked into new containers."""

    def __init__(self, client: AsyncShellbox) -> None:
        self._client = client

    async def create(self, container_id: str, *, name: str | None = None) -> Snapshot:
        """Snapshot a container while its processes keep running (frozen for milliseconds);
        429 ``RateLimitError`` past the project's snapshot count or bytes."""
        path = wire.container_path(container_id, "snapshots")
        body = wire.snapshot_body(name)
        return Snapshot.from_wire(
            wire.json_body(await self._client._request("POST", path, json=body))
        )

    async def retrieve(self, snapshot_id: str) -> Snapshot:
        path = wire.snapshot_path(snapshot_id)
        return Snapshot.from_wire(wire.json_body(await self._client._request("GET", path)))

    async def list(
        self, *, after: str | None = None, limit: int | None = None, order: str | None = None
    ) -> Page[Snapshot]:
        params = wire.list_params(after, limit, order)
        body = wire.json_body(await self._client._request("GET", "/snapshots", params=params))
        p = wire.page(body)
        return Page([Snapshot.from_wire(d) for d in p.data], p.has_more, p.first_id, p.last_id)

    async def list_all(
        self, *, limit: int | None = None, order: str | None = None
    ) -> AsyncIterator[Snapshot]:
        """Every snapshot of the project, following the cursor page by page."""
        after: str | None = None
        while True:
            p = await self.list(after=after, limit=limit, order=order)
            for snapshot in p.data:
                yield snapshot
            if not p.has_more or not p.data:
                return
            after = p.data[-1].id

    async def delete(self, snapshot_id: str) -> None:
        """Delete it and its storage; containers forked from it keep their files (and its
        bytes count against the quota until the last of them is gone)."""
        await self._client._request("DELETE", wire.snapshot_path(snapshot_id))

    async def fork(
        self,
        snapshot_id: str,
        *,
        name: str = "fork",
        memory_limit: str | None = None,
        expires_after_minutes: int | None = None,
        network_policy: Mapping[str, Any] | None = None,
        skills: Sequence[Mapping[str, Any]] | None = None,
    ) -> Container:
        """A new container starting from the snapshot's files (copy-on-write: no data is
        copied), with its own memory limit, expiry and network policy."""
        body = wire.fork_body(
            snapshot_id,
            name=name,
            memory_limit=memory_limit,
            expires_after_minutes=expires_after_minutes,
            network_policy=network_policy,
            skills=skills,
        )
        response = await self._client._request("POST", "/containers", json=body)
        return Container.from_wire(wire.json_body(response))


class AsyncPorts:
    """Links to services inside containers (``port_url`` is the client's own)."""

    def __init__(self, client: AsyncShellbox) -> None:
        self._client = client

    async def create_link(
        self, container_id: str, port: int, *, expires_in: int | None = None
    ) -> PortLink:
        """A URL that opens the service on ``port`` without a key, for ``expires_in`` seconds
        (default: the server's, an hour)."""
        path = wire.container_path(container_id, "ports", str(port), "links")
        body = wire.link_body(expires_in)
        response = await self._client._request("POST", path, json=body)
        return PortLink.from_wire(wire.json_body(response))
