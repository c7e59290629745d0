"""A sandbox provider for the Agents SDK: ``SandboxAgent`` runs its ``exec_command`` and file
tools in a shellbox container.

    client = ShellboxSandboxClient(base_url=..., api_key=...)
    run_config = RunConfig(sandbox=SandboxRunConfig(client=client,
                                                    options=ShellboxSandboxClientOptions()))

The workspace root is the container's ``/mnt/data``: a manifest that keeps the SDK's default
root (``/workspace``) is moved there, and other roots must lie under it. Commands run as the
sandbox user (uid 1000, no sudo) through the calls endpoint; files are read and written
through the server's workspace endpoints, so path checks and archive extraction happen on the
server side of the sandbox boundary. The server follows a symbolic link that stays inside
/mnt/data (a write goes to its target, as with the SDK's Docker provider) and refuses one that
leads out; that refusal is raised here as ``InvalidManifestPathError``, the SDK's error for a
path escaping the workspace.

Persisting the workspace (``workspace_persistence``): ``"auto"`` (the default) takes a
server-side snapshot of the container (O(1), and it keeps all the container's files: packages
installed under ``/home/user`` too) and hands the SDK a *snapshot reference* instead of a tar:
the bytes ``SHELLBOX_SNAPSHOT_V1\n`` then ``{"snapshot_id": ..., "base_url": ...}``, which
whatever ``SnapshotBase`` the run uses stores like any archive. Hydrating a reference forks the
snapshot into a new container that replaces the session's; hydrating anything else unpacks it
as a tar. ``"auto"`` persists a tar instead when the server has no snapshots (501) or the
session has paths the SDK asked to leave out (a snapshot cannot leave them out); ``"tar"``
always does (for a workspace to be hydrated on another server, or another provider: a
reference is only good on the server and project that took it, while the snapshot lives:
``lifecycle.snapshot_expires_after_days`` from its last use). A session's new persist deletes
the snapshot its previous one took, as a new tar replaces the previous one in the SDK's
snapshot store.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import logging
import math
import re
import shlex
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Literal

import openai
from agents.sandbox.errors import (
    ExecTimeoutError,
    ExecTransportError,
    InvalidManifestPathError,
    WorkspaceArchiveReadError,
    WorkspaceArchiveWriteError,
    WorkspaceReadNotFoundError,
    WorkspaceWriteTypeError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.session import SandboxSession, SandboxSessionState
from agents.sandbox.session.base_sandbox_session import BaseSandboxSession
from agents.sandbox.session.dependencies import Dependencies
from agents.sandbox.session.manager import Instrumentation
from agents.sandbox.session.pty_output import collect_pty_output
from agents.sandbox.session.pty_types import (
    PtyExecUpdate,
    allocate_pty_process_id,
    clamp_pty_yield_time_ms,
    process_id_to_prune_from_meta,
    resolve_pty_write_yield_time_ms,
)
from agents.sandbox.session.sandbox_client import BaseSandboxClient, BaseSandboxClientOptions
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec, resolve_snapshot
from agents.sandbox.types import ExecResult, User
from agents.sandbox.util.tar_utils import UnsafeTarMemberError, validate_tar_bytes
from pydantic import Field

from shellbox.client import (
    AsyncShellbox,
    AsyncTerminal,
    NotFoundError,
    ShellboxClientError,
    Snapshot,
)
from shellbox.client.errors import APIStatusError

log = logging.getLogger("shellbox.integrations.agents")

DATA_ROOT = "/mnt/data"
SDK_DEFAULT_ROOT = "/workspace"
# Names the sandbox user answers to; commands always run as uid 1000 (there is no sudo).
SANDBOX_USERS = frozenset({"user", "1000", "sandbox"})
# "No timeout" for the SDK; the server clamps it to its own maximum (300 s by default).
UNBOUNDED_TIMEOUT_MS = 24 * 60 * 60 * 1000
# The server's default clamp for one stream of one command, in characters.
EXEC_MAX_OUTPUT_LENGTH = 65_536
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
LIVE_STATUSES = ("running", "sleeping", "paused")  # either wakes on its next call
# The server's error code for a path whose symbolic links lead out of /mnt/data.
PATH_OUTSIDE_WORKSPACE = "path_outside_workspace"

# What a persisted workspace starts with when it is a reference to a server-side snapshot
# (the SDK's Modal, Runloop and Vercel providers mark theirs the same way).
SNAPSHOT_REF_MAGIC = b"SHELLBOX_SNAPSHOT_V1\n"
SNAPSHOTS_UNAVAILABLE = "snapshots_unavailable"

MemoryLimit = Literal["1g", "4g", "16g", "64g"]
WorkspacePersistence = Literal["auto", "tar"]


def encode_snapshot_ref(snapshot_id: str, base_url: str) -> bytes:
    body = {"snapshot_id": snapshot_id, "base_url": base_url}
    return SNAPSHOT_REF_MAGIC + json.dumps(body, sort_keys=True).encode()


def decode_snapshot_ref(raw: bytes) -> tuple[str, str] | None:
    """``(snapshot_id, base_url)`` of a reference; None for anything else (a tar)."""
    if not raw.startswith(SNAPSHOT_REF_MAGIC):
        return None
    try:
        body = json.loads(raw[len(SNAPSHOT_REF_MAGIC) :].decode())
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(body, dict):
        return None
    sid, url = body.get("snapshot_id"), body.get("base_url")
    if not isinstance(sid, str) or not sid or not isinstance(url, str):
        return None
    return sid, url


# Terminals a session keeps open in its container: the server's default cap per container
# (limits.max_ptys_per_container); past it the least recently used is closed, as the SDK's
# own providers prune at their cap.
MAX_PTYS = 8
PTY_BUFFER_BYTES = 1 << 20  # output held for the model per process; past it the process waits
# A process started without a tty: no terminal behaviour for it (a pipe as its output, no
# echo, no CR before LF, stdin /dev/null), while it still runs on and is polled like one.
NO_TTY = (
    "stty -echo -onlcr 2>/dev/null; "
    'bash -c {script} </dev/null 2>&1 | cat; exit "${{PIPESTATUS[0]}}"'
)


@dataclass(eq=False)
class _PtyProcess:
    """One process the SDK started with ``pty_exec_start``, on its own terminal."""

    terminal: AsyncTerminal
    exits: contextlib.AsyncExitStack
    tty: bool
    last_used: float = field(default_factory=time.monotonic)
    output_chunks: deque[bytes] = field(default_factory=deque)
    output_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    output_notify: asyncio.Event = field(default_factory=asyncio.Event)
    output_closed: asyncio.Event = field(default_factory=asyncio.Event)
    room: asyncio.Event = field(default_factory=asyncio.Event)
    pump: asyncio.Task[None] | None = None

    def buffered(self) -> int:
        return sum(len(c) for c in self.output_chunks)


class ShellboxSandboxClientOptions(BaseSandboxClientOptions):
    """How to create the container of a new sandbox session."""

    type: Literal["shellbox"] = "shellbox"
    name: str = "agents-sandbox"
    memory_limit: MemoryLimit | None = None
    expires_after_minutes: int | None = Field(default=None, ge=1)
    network_policy: dict[str, Any] | None = None
    skills: list[dict[str, Any]] | None = None
    file_ids: list[str] | None = None
    keep_on_exit: bool = False
    """Leave the container running when the session shuts down (it sleeps when idle and
    expires by itself), so ``resume`` can reattach to it instead of hydrating a new one."""
    workspace_persistence: WorkspacePersistence = "auto"
    """How the workspace is persisted: ``"auto"``, a reference to a server-side snapshot
    when the server takes them (else a tar); ``"tar"``, always a tar (portable to other
    servers and providers)."""


class ShellboxSandboxSessionState(SandboxSessionState):
    """What a resumed session needs: the container to reattach to, and how to recreate it."""

    type: Literal["shellbox"] = "shellbox"
    container_id: str
    name: str = "agents-sandbox"
    memory_limit: MemoryLimit | None = None
    expires_after_minutes: int | None = None
    network_policy: dict[str, Any] | None = None
    skills: list[dict[str, Any]] | None = None
    file_ids: list[str] | None = None
    keep_on_exit: bool = False
    workspace_persistence: WorkspacePersistence = "auto"
    # The snapshot this session's last persist took (deleted by its next persist).
    persisted_snapshot_id: str | None = None


def shellbox_manifest(manifest: Manifest | None) -> Manifest:
    """The manifest with its root inside ``/mnt/data`` (the SDK default moves there)."""
    if manifest is None:
        return Manifest(root=DATA_ROOT)
    root = PurePosixPath(manifest.root)
    if str(root) == SDK_DEFAULT_ROOT:
        return manifest.model_copy(update={"root": DATA_ROOT})
    if str(root) == DATA_ROOT or PurePosixPath(DATA_ROOT) in root.parents:
        return manifest
    msg = (
        f"manifest.root {manifest.root!r} is outside {DATA_ROOT}; a shellbox workspace is "
        f"{DATA_ROOT} or a directory under it"
    )
    raise ValueError(msg)


def _data_relative(path: Path | PurePosixPath) -> str:
    """``path`` relative to /mnt/data ('' for /mnt/data itself); outside it: ValueError."""
    rel = PurePosixPath(path.as_posix()).relative_to(DATA_ROOT)
    return "" if str(rel) == "." else rel.as_posix()


def _raise_if_outside(path: Path | str, exc: ShellboxClientError) -> None:
    """The SDK's error for a path that escapes the workspace (as its Docker provider raises
    for a symbolic link that leads out), when the server refused the path for that reason."""
    if isinstance(exc, APIStatusError) and exc.code == PATH_OUTSIDE_WORKSPACE:
        raise InvalidManifestPathError(
            rel=Path(path).as_posix(), reason="escape_root", context={"detail": exc.message}
        ) from exc


def _user_name(user: str | User | None) -> str | None:
    return user.name if isinstance(user, User) else user


class ShellboxSandboxSession(BaseSandboxSession):
    """One sandbox session backed by one shellbox container."""

    state: ShellboxSandboxSessionState

    def __init__(self, *, state: ShellboxSandboxSessionState, client: AsyncShellbox) -> None:
        self.state = state
        self._api = client
        self._root_ready = state.workspace_root_ready
        self._ptys: dict[int, _PtyProcess] = {}
        self._pty_lock = asyncio.Lock()

    @property
    def container_id(self) -> str:
        return self.state.container_id

    def _current_runtime_helper_cache_key(self) -> object | None:
        # Helpers live in the container's /tmp: a new container needs them installed again.
        return self.state.container_id

    def supports_pty(self) -> bool:
        # exec_command runs on a terminal of the container (GET /v1/containers/{id}/pty), so
        # a process may outlive its yield time and be driven with write_stdin.
        return True

    # -- lifecycle --------------------------------------------------------------------------

    async def _prepare_backend_workspace(self) -> None:
        root = self._workspace_root_path()
        if root.as_posix() != DATA_ROOT and not self._root_ready:
            result = await self._exec_internal("mkdir", "-p", "--", root.as_posix())
            if not result.ok():
                raise WorkspaceArchiveWriteError(
                    path=root,
                    context={"reason": "root_make_failed", "stderr": result.stderr.decode()},
                )
        self._root_ready = True

    def _mark_workspace_root_ready_from_probe(self) -> None:
        super()._mark_workspace_root_ready_from_probe()
        self._root_ready = True

    async def running(self) -> bool:
        try:
            container = await self._api.openai.containers.retrieve(self.state.container_id)
        except openai.APIError:
            return False
        return container.status in LIVE_STATUSES

    async def _shutdown_backend(self) -> None:
        if self.state.keep_on_exit:
            return
        try:
            await self._api.openai.containers.delete(self.state.container_id)
        except openai.NotFoundError:
            return
        except openai.APIError as exc:
            log.warning("could not delete container %s: %s", self.state.container_id, exc)

    # -- exec -------------------------------------------------------------------------------

    @staticmethod
    def _without_sudo(command: tuple[str | Path, ...]) -> tuple[list[str], str | None]:
        """The argv without the ``sudo -u USER --`` that SandboxSession adds for run_as
        users (there is no sudo in a shellbox container, and every command already runs as
        the sandbox user); the refusal to print instead when USER is another user."""
        argv = [str(c) for c in command]
        if len(argv) >= 4 and argv[0] == "sudo" and argv[1] == "-u" and argv[3] == "--":
            user, argv = argv[2], argv[4:]
            if user not in SANDBOX_USERS:
                return argv, f"shellbox runs commands as the sandbox user only, not as {user!r}\n"
        return argv, None

    async def _exec_internal(
        self, *command: str | Path, timeout: float | None = None
    ) -> ExecResult:
        argv, refused = self._without_sudo(command)
        if refused is not None:
            return ExecResult(stdout=b"", stderr=refused.encode(), exit_code=1)
        script = await self._script(argv)
        timeout_ms = UNBOUNDED_TIMEOUT_MS
        if timeout is not None:
            timeout_ms = max(1, math.ceil(timeout * 1000))
        try:
            out = await self._api.calls.shell(
                self.state.container_id,
                [script],
                timeout_ms=timeout_ms,
                max_output_length=EXEC_MAX_OUTPUT_LENGTH,
            )
        except ShellboxClientError as exc:
            raise ExecTransportError(
                command=command,
                context={"backend": "shellbox", "detail": str(exc)},
                cause=exc,
            ) from exc
        if not out.output:
            raise ExecTransportError(
                command=command, context={"backend": "shellbox", "detail": "no output entry"}
            )
        result = out.output[0]
        if result.timed_out:
            raise ExecTimeoutError(
                command=command,
                timeout_s=timeout,
                context={"stdout": result.stdout[-2000:], "stderr": result.stderr[-2000:]},
            )
        return ExecResult(
            stdout=result.stdout.encode("utf-8"),
            stderr=result.stderr.encode("utf-8"),
            exit_code=result.exit_code if result.exit_code is not None else 0,
        )

    # -- terminals (the SDK's PTY methods) ---------------------------------------------------

    async def pty_exec_start(
        self,
        *command: str | Path,
        timeout: float | None = None,
        shell: bool | list[str] = True,
        user: str | User | None = None,
        tty: bool = False,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        _ = timeout  # a process lives until it exits or the session ends, as the SDK's do
        argv, refused = self._without_sudo(
            tuple(self._prepare_exec_command(*command, shell=shell, user=user))
        )
        if refused is not None:
            return PtyExecUpdate(
                process_id=None, output=refused.encode(), exit_code=1, original_token_count=None
            )
        script = await self._script(argv)
        if not tty:
            script = NO_TTY.format(script=shlex.quote(script))
        exits = contextlib.AsyncExitStack()
        try:
            terminal = await exits.enter_async_context(
                self._api.pty(self.state.container_id, command=script)
            )
        except ShellboxClientError as exc:
            await exits.aclose()
            # Nothing ran: the SDK may run a command without a tty one-shot instead.
            raise ExecTransportError(
                command=command,
                context={"backend": "shellbox", "detail": str(exc), "retry_safe": True},
                cause=exc,
            ) from exc
        entry = _PtyProcess(terminal=terminal, exits=exits, tty=tty)
        entry.room.set()
        entry.pump = asyncio.create_task(self._pump(entry))
        async with self._pty_lock:
            pruned = self._prune_ptys()
            process_id = allocate_pty_process_id(set(self._ptys))
            self._ptys[process_id] = entry
        if pruned is not None:
            await self._close_pty(pruned)
        yield_ms = 10_000 if yield_time_s is None else int(yield_time_s * 1000)
        return await self._pty_update(
            process_id, entry, clamp_pty_yield_time_ms(yield_ms), max_output_tokens
        )

    async def pty_write_stdin(
        self,
        *,
        session_id: int,
        chars: str,
        yield_time_s: float | None = None,
        max_output_tokens: int | None = None,
    ) -> PtyExecUpdate:
        async with self._pty_lock:
            entry = self._resolve_pty_session_entry(pty_processes=self._ptys, session_id=session_id)
        if chars:
            if not entry.tty:
                msg = "stdin is not available for this process"  # the SDK's tools match it
                raise RuntimeError(msg)
            with contextlib.suppress(ShellboxClientError, ConnectionError):
                await entry.terminal.send(chars)
            await asyncio.sleep(0.1)  # let the process answer, as the SDK's providers do
        yield_ms = 250 if yield_time_s is None else int(yield_time_s * 1000)
        entry.last_used = time.monotonic()
        return await self._pty_update(
            session_id,
            entry,
            resolve_pty_write_yield_time_ms(yield_time_ms=yield_ms, input_empty=chars == ""),
            max_output_tokens,
        )

    async def pty_terminate_all(self) -> None:
        async with self._pty_lock:
            entries = list(self._ptys.values())
            self._ptys.clear()
        for entry in entries:
            await self._close_pty(entry)

    async def _pump(self, entry: _PtyProcess) -> None:
        """Move the terminal's output to the entry, holding the process back (by not
        reading) while the model has not collected ``PTY_BUFFER_BYTES`` of it."""
        try:
            async for chunk in entry.terminal:
                async with entry.output_lock:
                    entry.output_chunks.append(chunk)
                    if entry.buffered() >= PTY_BUFFER_BYTES:
                        entry.room.clear()
                entry.output_notify.set()
                await entry.room.wait()
        except ShellboxClientError as exc:  # closed by the server (container gone): ended
            log.info("terminal of %s ended: %s", self.state.container_id, exc)
        finally:
            entry.output_closed.set()
            entry.output_notify.set()

    async def _pty_update(
        self, process_id: int, entry: _PtyProcess, yield_ms: int, max_output_tokens: int | None
    ) -> PtyExecUpdate:
        output, tokens, closed = await collect_pty_output(
            output_chunks=entry.output_chunks,
            output_lock=entry.output_lock,
            output_notify=entry.output_notify,
            is_done=entry.output_closed.is_set,
            yield_time_ms=yield_ms,
            max_output_tokens=max_output_tokens,
        )
        entry.room.set()
        if not closed:
            return PtyExecUpdate(
                process_id=process_id, output=output, exit_code=None, original_token_count=tokens
            )
        async with self._pty_lock:
            removed = self._ptys.pop(process_id, None)
        if removed is not None:
            await self._close_pty(removed)
        code = entry.terminal.exit_code
        return PtyExecUpdate(
            process_id=None,
            output=output,
            exit_code=code if code is not None else 1,
            original_token_count=tokens,
        )

    def _prune_ptys(self) -> _PtyProcess | None:
        if len(self._ptys) < MAX_PTYS:
            return None
        meta = [(pid, e.last_used, e.output_closed.is_set()) for pid, e in self._ptys.items()]
        victim = process_id_to_prune_from_meta(meta)
        return None if victim is None else self._ptys.pop(victim, None)

    @staticmethod
    async def _close_pty(entry: _PtyProcess) -> None:
        """Close the terminal (the server kills what it started) and stop its pump."""
        await entry.exits.aclose()
        entry.room.set()
        if entry.pump is not None:
            entry.pump.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await entry.pump

    async def _script(self, argv: list[str]) -> str:
        """The bash script for one argv: the workspace as cwd, the manifest's environment."""
        lines = []
        root = self._workspace_root_path().as_posix()
        if self._root_ready and root != DATA_ROOT:
            lines.append(f"cd -- {shlex.quote(root)} || exit 1")
        env = await self.state.manifest.environment.resolve()
        for name, value in env.items():
            if not _ENV_NAME.match(name):
                msg = f"manifest environment name {name!r} is not a valid variable name"
                raise ValueError(msg)
            lines.append(f"export {name}={shlex.quote(value)}")
        lines.append(shlex.join(argv))
        return "\n".join(lines)

    # -- files ------------------------------------------------------------------------------

    def _rel(self, path: Path, *, for_write: bool) -> str:
        try:
            return _data_relative(path)
        except ValueError:
            # Reachable only through an extra path grant: the server serves /mnt/data only.
            context = {"reason": "outside_data_dir", "data_dir": DATA_ROOT}
            if for_write:
                raise WorkspaceArchiveWriteError(path=path, context=context) from None
            raise WorkspaceArchiveReadError(path=path, context=context) from None

    async def _validate_path_access(self, path: Path | str, *, for_write: bool = False) -> Path:
        """The SDK's check before a command (ls, mkdir, rm, mv) touches ``path``: the server
        follows its symbolic links, and one that leads out of the workspace is refused with
        InvalidManifestPathError, as the SDK's Docker provider does. The path returned is the
        one asked for, so a leaf link is still removed or moved as a link."""
        workspace_path = self.normalize_path(path, for_write=for_write)
        try:
            rel = _data_relative(workspace_path)
        except ValueError:
            return workspace_path  # an extra path grant: outside what the server serves
        if rel:
            try:
                await self._api.workspace.resolve(self.state.container_id, rel)
            except ShellboxClientError as exc:
                _raise_if_outside(path, exc)
                error = WorkspaceArchiveWriteError if for_write else WorkspaceArchiveReadError
                raise error(path=workspace_path, context={"detail": str(exc)}, cause=exc) from exc
        return workspace_path

    def _check_user(self, user: str | User | None) -> None:
        name = _user_name(user)
        if name is not None and name not in SANDBOX_USERS:
            msg = f"shellbox reads and writes files as the sandbox user only, not as {name!r}"
            raise ValueError(msg)

    async def read(self, path: Path, *, user: str | User | None = None) -> io.IOBase:
        return io.BytesIO(await self._read(path, user=user, max_bytes=None))

    async def _read_bounded(self, path: Path, *, max_bytes: int) -> bytes:
        return await self._read(path, user=None, max_bytes=max_bytes)

    async def _read(self, path: Path, *, user: str | User | None, max_bytes: int | None) -> bytes:
        self._check_user(user)
        # The server follows or refuses the links on the path itself: no round trip first.
        workspace_path = self.normalize_path(path)
        rel = self._rel(workspace_path, for_write=False)
        try:
            return await self._api.workspace.read(self.state.container_id, rel, max_bytes=max_bytes)
        except NotFoundError as exc:
            if exc.code == "file_not_found":
                raise WorkspaceReadNotFoundError(path=Path(path), cause=exc) from exc
            raise WorkspaceArchiveReadError(
                path=Path(path), context={"detail": exc.message}, cause=exc
            ) from exc
        except ShellboxClientError as exc:
            _raise_if_outside(path, exc)
            raise WorkspaceArchiveReadError(
                path=Path(path), context={"detail": str(exc)}, cause=exc
            ) from exc

    async def write(self, path: Path, data: io.IOBase, *, user: str | User | None = None) -> None:
        self._check_user(user)
        payload = data.read()
        if isinstance(payload, str):
            payload = payload.encode("utf-8")
        if not isinstance(payload, bytes | bytearray):
            raise WorkspaceWriteTypeError(path=Path(path), actual_type=type(payload).__name__)
        workspace_path = self.normalize_path(path, for_write=True)  # the server checks links
        rel = self._rel(workspace_path, for_write=True)
        try:
            await self._api.workspace.write(self.state.container_id, rel, bytes(payload))
        except ShellboxClientError as exc:
            _raise_if_outside(path, exc)
            raise WorkspaceArchiveWriteError(
                path=workspace_path, context={"detail": str(exc)}, cause=exc
            ) from exc

    # -- persistence ------------------------------------------------------------------------

    async def persist_workspace(self) -> io.IOBase:
        """A reference to a new server-side snapshot, or a tar of the workspace (see the
        module's docstring for which)."""
        if self.state.workspace_persistence == "auto" and not self._persist_skip_paths():
            snapshot = await self._take_snapshot()
            if snapshot is not None:
                return io.BytesIO(encode_snapshot_ref(snapshot.id, self._api.base_url))
        return await self._persist_tar()

    def _persist_skip_paths(self) -> list[str]:
        return sorted(p.as_posix() for p in self._persist_workspace_skip_relpaths())

    async def _take_snapshot(self) -> Snapshot | None:
        """The container's snapshot; None when the server takes none (tar then)."""
        root = self._workspace_root_path()
        name = f"agents-{self.state.session_id.hex[:12]}"
        try:
            snapshot = await self._api.snapshots.create(self.state.container_id, name=name)
        except APIStatusError as exc:
            if exc.code == SNAPSHOTS_UNAVAILABLE:
                return None
            raise WorkspaceArchiveReadError(
                path=root, context={"reason": "snapshot_failed", "detail": exc.message}, cause=exc
            ) from exc
        except ShellboxClientError as exc:
            raise WorkspaceArchiveReadError(
                path=root, context={"reason": "snapshot_failed", "detail": str(exc)}, cause=exc
            ) from exc
        previous, self.state.persisted_snapshot_id = self.state.persisted_snapshot_id, snapshot.id
        if previous is not None and previous != snapshot.id:
            try:
                await self._api.snapshots.delete(previous)
            except NotFoundError:
                pass  # expired, or deleted by someone else
            except ShellboxClientError as exc:
                log.warning("could not delete the previous snapshot %s: %s", previous, exc)
        return snapshot

    async def _persist_tar(self) -> io.IOBase:
        root = self._workspace_root_path()
        try:
            raw = await self._api.workspace.export_archive(
                self.state.container_id,
                path=_data_relative(root) or None,
                exclude=self._persist_skip_paths(),
            )
        except ShellboxClientError as exc:
            raise WorkspaceArchiveReadError(
                path=root, context={"detail": str(exc)}, cause=exc
            ) from exc
        return io.BytesIO(raw)

    async def hydrate_workspace(self, data: io.IOBase) -> None:
        root = self._workspace_root_path()
        raw = data.read()
        if isinstance(raw, str):
            raw = raw.encode("utf-8")
        if not isinstance(raw, bytes | bytearray):
            raise WorkspaceWriteTypeError(path=root, actual_type=type(raw).__name__)
        ref = decode_snapshot_ref(bytes(raw))
        if ref is not None:
            await self._hydrate_from_snapshot(*ref)
            return
        try:
            # The server unpacks inside the container anyway; refusing here gives the caller
            # the SDK's own error for archives no provider accepts.
            validate_tar_bytes(bytes(raw), allow_external_symlink_targets=False)
        except UnsafeTarMemberError as exc:
            raise WorkspaceArchiveWriteError(
                path=root,
                context={"reason": "unsafe_or_invalid_tar", "member": exc.member},
                cause=exc,
            ) from exc
        try:
            await self._api.workspace.import_archive(
                self.state.container_id, bytes(raw), path=_data_relative(root) or None
            )
        except ShellboxClientError as exc:
            raise WorkspaceArchiveWriteError(
                path=root, context={"detail": str(exc)}, cause=exc
            ) from exc
        self._root_ready = True

    async def _hydrate_from_snapshot(self, snapshot_id: str, base_url: str) -> None:
        """Replace the session's container with a fork of the snapshot: the whole container
        as it was persisted (the workspace, and what was installed outside it)."""
        root = self._workspace_root_path()
        context: dict[str, object] = {"snapshot_id": snapshot_id, "snapshot_base_url": base_url}
        try:
            fork = await self._api.snapshots.fork(snapshot_id, **fork_settings(self.state))
        except NotFoundError as exc:
            # Not on this server (or project), or expired: there is no tar to fall back to.
            context |= {
                "reason": "snapshot_not_found",
                "detail": f"{exc.message} A snapshot reference is only good on the server and "
                "project that took it; persist with workspace_persistence='tar' to move a "
                "workspace elsewhere.",
            }
            raise WorkspaceArchiveWriteError(path=root, context=context, cause=exc) from exc
        except ShellboxClientError as exc:
            context |= {"reason": "fork_failed", "detail": str(exc)}
            raise WorkspaceArchiveWriteError(path=root, context=context, cause=exc) from exc
        replaced, self.state.container_id = self.state.container_id, fork.id
        self._root_ready = True
        if replaced:
            try:
                await self._api.openai.containers.delete(replaced)
            except openai.NotFoundError:
                pass
            except openai.APIError as exc:
                log.warning("could not delete the replaced container %s: %s", replaced, exc)

    async def _restore_snapshot_into_workspace_on_resume(self) -> None:
        """As the SDK's, but a snapshot reference replaces the whole container: clearing the
        workspace first would be wasted round trips."""
        archive = await self.state.snapshot.restore(dependencies=self.dependencies)
        try:
            raw = archive.read()
        finally:
            archive.close()
        payload = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
        if decode_snapshot_ref(payload) is None:
            await self._clear_workspace_root_on_resume()
        await self.hydrate_workspace(io.BytesIO(payload))


def fork_settings(state: ShellboxSandboxSessionState) -> dict[str, Any]:
    """The session's container settings, for a fork that replaces its container (file_ids
    are left out: their files are in the snapshot already)."""
    return {
        "name": state.name,
        "memory_limit": state.memory_limit,
        "expires_after_minutes": state.expires_after_minutes,
        "network_policy": state.network_policy,
        "skills": state.skills,
    }


class ShellboxSandboxClient(BaseSandboxClient[ShellboxSandboxClientOptions]):
    """Creates, resumes and deletes shellbox-backed sandbox sessions."""

    backend_id = "shellbox"
    supports_default_options = True

    def __init__(
        self,
        client: AsyncShellbox | None = None,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        instrumentation: Instrumentation | None = None,
        dependencies: Dependencies | None = None,
    ) -> None:
        self.api = client or AsyncShellbox(base_url, api_key)
        self._instrumentation = instrumentation or Instrumentation()
        self._dependencies = dependencies

    async def create(
        self,
        *,
        snapshot: SnapshotSpec | SnapshotBase | None = None,
        manifest: Manifest | None = None,
        options: ShellboxSandboxClientOptions | None = None,
    ) -> SandboxSession:
        options = options or ShellboxSandboxClientOptions()
        manifest = shellbox_manifest(manifest)
        self._validate_manifest_for_create(manifest)
        session_id = uuid.uuid4()
        state = ShellboxSandboxSessionState(
            session_id=session_id,
            manifest=manifest,
            snapshot=resolve_snapshot(snapshot, str(session_id)),
            container_id="",
            name=options.name,
            memory_limit=options.memory_limit,
            expires_after_minutes=options.expires_after_minutes,
            network_policy=options.network_policy,
            skills=options.skills,
            file_ids=options.file_ids,
            keep_on_exit=options.keep_on_exit,
            workspace_persistence=options.workspace_persistence,
        )
        state.container_id = await self._create_container(state)
        inner = ShellboxSandboxSession(state=state, client=self.api)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    async def _create_container(self, state: ShellboxSandboxSessionState) -> str:
        args: dict[str, Any] = {"name": state.name}
        if state.memory_limit is not None:
            args["memory_limit"] = state.memory_limit
        if state.expires_after_minutes is not None:
            args["expires_after"] = {
                "anchor": "last_active_at",
                "minutes": state.expires_after_minutes,
            }
        if state.network_policy is not None:
            args["network_policy"] = state.network_policy
        if state.skills is not None:
            args["skills"] = state.skills
        if state.file_ids is not None:
            args["file_ids"] = state.file_ids
        container = await self.api.openai.containers.create(**args)
        return container.id

    async def delete(self, session: SandboxSession) -> SandboxSession:
        # The container went away in shutdown(); nothing else is held per session.
        if not isinstance(session._inner, ShellboxSandboxSession):
            msg = "ShellboxSandboxClient.delete expects a ShellboxSandboxSession"
            raise TypeError(msg)
        return session

    async def resume(self, state: SandboxSessionState) -> SandboxSession:
        """Reattach to the state's container while it lives; otherwise create a new one whose
        workspace ``start()`` restores from the state's snapshot."""
        if not isinstance(state, ShellboxSandboxSessionState):
            msg = "ShellboxSandboxClient.resume expects a ShellboxSandboxSessionState"
            raise TypeError(msg)
        state.assert_path_grants_rebound()
        reconnected = False
        if state.container_id:
            try:
                container = await self.api.openai.containers.retrieve(state.container_id)
                reconnected = container.status in LIVE_STATUSES
            except openai.NotFoundError:
                reconnected = False
        if not reconnected:
            state.container_id = await self._create_container(state)
            state.workspace_root_ready = False
        inner = ShellboxSandboxSession(state=state, client=self.api)
        inner._set_start_state_preserved(reconnected, system=reconnected)
        return self._wrap_session(inner, instrumentation=self._instrumentation)

    def deserialize_session_state(self, payload: dict[str, object]) -> SandboxSessionState:
        return self._deserialize_session_state_payload(payload, ShellboxSandboxSessionState)

    async def aclose(self) -> None:
        """Close the HTTP connections (sessions' containers are handled by their shutdown)."""
        await self.api.aclose()
