"""The ``shellbox`` command: serve, node, run, shell, image, keys, db, patch."""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from shellbox.errors import ImageBuildError, InvalidRequest, ShellboxError, SnapshotNotFound
from shellbox.settings import Settings, load_settings

if TYPE_CHECKING:
    from shellbox.sandbox.image import Profile


def _settings(args: argparse.Namespace, **extra: Any) -> Settings:
    overrides: dict[str, Any] = {}
    if getattr(args, "state_dir", None):
        overrides["state_dir"] = Path(args.state_dir).resolve()
    if getattr(args, "database_url", None):
        overrides["store"] = {"database_url": args.database_url}
    for k, v in extra.items():
        if v is not None:
            overrides[k] = v
    return load_settings(getattr(args, "config", None), **overrides)


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--state-dir", help="state directory (env SHELLBOX_STATE_DIR)")
    p.add_argument("--config", type=Path, help="TOML settings file (env SHELLBOX_CONFIG)")


def cmd_run(args: argparse.Namespace) -> int:
    from shellbox.ids import new_id
    from shellbox.sandbox import ContainerSpec, create_runtime
    from shellbox.service.shell import ShellLimits, shell_call_output_item

    settings = _settings(args)
    limits = ShellLimits.from_settings(settings.limits)
    commands: list[str] = args.commands
    if commands and commands[0] == "--":
        commands = commands[1:]
    request = limits.exec_request(
        commands, args.timeout_ms, args.max_output_length, param="commands"
    )
    if args.snapshot and args.container:
        msg = "--snapshot starts a new container from the snapshot: leave out --container"
        raise InvalidRequest(msg, param="snapshot")
    if args.snapshot:
        _use_snapshot(settings, args.snapshot)
    runtime = create_runtime(settings)

    async def go() -> dict[str, Any]:
        if args.container:
            container_id = args.container
            await runtime.start(container_id)  # no-op when it already runs
        else:
            container_id = new_id("cntr_")
            spec = ContainerSpec(
                id=container_id,
                memory_limit=args.memory_limit,
                pids_limit=settings.runtime.pids_limit,
                cpus=settings.runtime.cpus,
                tmp_size_mb=settings.runtime.tmp_size_mb,
                disk_limit_bytes=settings.disk_limit_bytes(),
            )
            if args.snapshot:
                await runtime.fork(spec, args.snapshot)
            else:
                await runtime.create(spec)
        try:
            if not args.container:
                await runtime.start(container_id)
            results = await runtime.run(container_id, request)
        except BaseException:
            if not args.container and not args.keep:
                await runtime.destroy(container_id)
            raise
        if args.keep:
            print(container_id)
        elif not args.container:
            await runtime.destroy(container_id)
        return shell_call_output_item(new_id("call_"), results, request.max_output_length)

    item = asyncio.run(go())
    if not args.keep:
        print(json.dumps(item, ensure_ascii=False))
    else:
        print(json.dumps(item, ensure_ascii=False), file=sys.stderr)
    return 0


def _use_snapshot(settings: Settings, snapshot_id: str) -> None:
    """A fork from the command line uses its snapshot as one through the API does (it moves
    ``last_used_at``, which expiry counts from); a deleted or expired one is refused. The
    server's store decides, whatever the project: ``run`` is the host operator's tool."""
    import time

    from shellbox.store import create_database, create_stores

    db = create_database(settings.database_url())
    try:
        store = create_stores(db).snapshots
        if snapshot_id not in store.ids():
            msg = f"no snapshot {snapshot_id!r} on this server (deleted, expired, or never taken)"
            raise SnapshotNotFound(msg, param="snapshot")
        store.used(snapshot_id, int(time.time()))
    finally:
        db.dispose()


def _profile(args: argparse.Namespace, settings: Settings) -> Profile:
    from shellbox.sandbox.image import canonical

    return canonical(args.profile) if args.profile else settings.runtime.image_profile


def cmd_shell(args: argparse.Namespace) -> int:
    from shellbox.client import AsyncShellbox, ShellboxClientError
    from shellbox.client.interactive import run_shell

    async def go() -> int:
        async with AsyncShellbox(args.base_url, args.api_key) as client:
            return await run_shell(client, args.container_id, command=args.command)

    try:
        return asyncio.run(go())
    except ShellboxClientError as exc:
        print(f"shellbox shell: {exc}", file=sys.stderr)
        return 1


def cmd_image_build(args: argparse.Namespace) -> int:
    from shellbox.sandbox.image import ensure_image

    settings = _settings(args)
    settings.image_dir().mkdir(parents=True, exist_ok=True)
    image = ensure_image(settings.image_dir(), _profile(args, settings), force=args.force)
    print(image.path)
    return 0


def cmd_image_info(args: argparse.Namespace) -> int:
    """What an image holds, as probed from it when it was built (JSON, or a Markdown table of
    every built profile with ``--markdown``: the README's table is this output)."""
    from shellbox.sandbox.image import PROFILE_NAMES, canonical, image_for
    from shellbox.sandbox.image_info import describe, markdown_table

    settings = _settings(args)
    if args.markdown:
        profiles = [canonical(args.profile)] if args.profile else list(PROFILE_NAMES)
        images = [image_for(settings.image_dir(), p) for p in profiles]
        missing = [i.profile for i in images if not i.ready]
        if missing:
            msg = f"not built: {', '.join(missing)}; run `shellbox image build --profile NAME`"
            raise ImageBuildError(msg)
        print(markdown_table(images))
        return 0
    image = image_for(settings.image_dir(), _profile(args, settings))
    if not image.ready:
        msg = f"the {image.profile} image is not built; run `shellbox image build`"
        raise ImageBuildError(msg)
    print(json.dumps(describe(image), indent=2))
    return 0


def _key_state(settings: Settings) -> tuple[bool, bool]:
    """(whether any key is active, whether the store ever held a key)."""
    from shellbox.service.keys import KeyService
    from shellbox.store import create_database
    from shellbox.store.keys import SqlKeyStore

    settings.state_dir.mkdir(parents=True, exist_ok=True)
    db = create_database(settings.database_url())
    try:
        keys = KeyService(SqlKeyStore(db))
        return keys.any_active(), keys.ever_had_key()
    finally:
        db.dispose()


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from shellbox.app import create_app
    from shellbox.service.keys import is_loopback
    from shellbox.services import api_settings, create_services

    server: dict[str, Any] = {}
    if args.host:
        server["host"] = args.host
    if args.port is not None:
        server["port"] = args.port
    extra: dict[str, Any] = {"server": server} if server else {}
    if args.database_url:
        extra["store"] = {"database_url": args.database_url}
    upstream = {
        k: v
        for k, v in (
            ("base_url", args.upstream_base_url),
            ("api_key", args.upstream_api_key),
            ("dialect", args.upstream_dialect),
        )
        if v
    }
    if upstream:
        extra["upstream"] = upstream
    egress: dict[str, Any] = {}
    if args.egress_allow:
        egress["allow"] = [p.strip() for a in args.egress_allow for p in a.split(",") if p.strip()]
    if args.egress_upstream_ca:
        egress["upstream_ca"] = [Path(p).resolve() for p in args.egress_upstream_ca]
    if args.egress_hosts_file:
        egress["hosts_file"] = Path(args.egress_hosts_file).resolve()
    if egress:
        extra["egress"] = egress
    cluster: dict[str, Any] = {}
    if args.role:
        cluster["role"] = args.role
    if args.cluster_key_file:
        cluster["key_file"] = Path(args.cluster_key_file).resolve()
    if cluster:
        extra["cluster"] = cluster
    settings = _settings(args, **extra)
    if settings.cluster.role == "api":
        # Refused before the key check below opens the database: a replica pointed at the
        # default SQLite file must not create and migrate one on its way out.
        settings = api_settings(settings)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # Checked before anything is built: with no keys every bearer token is accepted, which is
    # only safe when nothing but this machine can connect.
    active, ever = _key_state(settings)
    if not is_loopback(settings.server.host) and not active:
        print(
            f"shellbox: refusing to listen on {settings.server.host} with no API keys: create "
            "one with `shellbox keys create --project NAME`, or bind 127.0.0.1",
            file=sys.stderr,
        )
        return 2
    if ever and not active:
        # Not open mode: that is only for a store that never held a key.
        print(
            "shellbox: every API key has been revoked, so every request will be refused "
            "until one is created with `shellbox keys create --project NAME`",
            file=sys.stderr,
        )
    services = create_services(settings)  # builds the image first if it is missing
    app = create_app(settings, services)
    uvicorn.run(
        app,
        host=settings.server.host,
        port=settings.server.port,
        log_level="warning",
        access_log=False,
        # Every WebSocket message is held whole: bound it (uvicorn's default is 16 MiB).
        ws_max_size=settings.limits.ws_max_message_bytes,
    )
    return 0


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        msg = f"--listen {value!r} must be HOST:PORT"
        raise argparse.ArgumentTypeError(msg)
    return host.strip("[]") or "0.0.0.0", int(port)


def cmd_node(args: argparse.Namespace) -> int:
    import logging
    import socket

    import uvicorn

    from shellbox.node import build_node, node_info
    from shellbox.node.info import tls_files
    from shellbox.sandbox.remote import load_cluster_key
    from shellbox.sandbox.remote_streams import MAX_MESSAGE, keepalive

    host, port = args.listen
    settings = _settings(args)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        key = load_cluster_key(Path(args.cluster_key_file))
        tls = tls_files(settings.cluster.tls_cert_file, settings.cluster.tls_key_file)
    except ShellboxError as exc:
        print(f"shellbox node: {exc}", file=sys.stderr)
        return 2
    info = node_info(args.name, args.advertise, host, port, tls=tls is not None)
    node = build_node(settings, key, info)  # builds the image first if it is missing
    logging.getLogger("shellbox.node").info(
        "node %s serving its runtime on %s:%d (advertised as %s)",
        info.name, host, port, info.advertise_url,
    )  # fmt: skip
    # The streams' WebSockets (``remote_streams.py``) carry back-pressure, so a caller that
    # reads slowly must not be cut off for missing a ping: no pings, and TCP keepalive on the
    # listening socket (accepted connections inherit it) finds a caller that is gone.
    listener = socket.create_server(
        (host, port), family=socket.AF_INET6 if ":" in host else socket.AF_INET
    )
    keepalive(listener)
    config = uvicorn.Config(
        node.app,
        log_level="warning",
        access_log=False,
        ws="websockets-sansio",  # reads a message only once the relay took the last
        ws_ping_interval=None,
        ws_max_size=MAX_MESSAGE,
        ssl_certfile=tls[0] if tls else None,
        ssl_keyfile=tls[1] if tls else None,
    )
    uvicorn.Server(config).run(sockets=[listener])
    return 0


ADMIN_PROJECT = "admin"  # the project of an admin key made without --project


def _key_service(args: argparse.Namespace) -> Any:
    from shellbox.service.keys import KeyService
    from shellbox.store import create_database
    from shellbox.store.keys import SqlKeyStore

    settings = _settings(args)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    return KeyService(SqlKeyStore(create_database(settings.database_url())))


def cmd_keys_create(args: argparse.Namespace) -> int:
    if args.project is None and not args.admin:
        print("shellbox: keys create needs --project NAME (or --admin)", file=sys.stderr)
        return 2
    project = args.project or ADMIN_PROJECT
    key, token = _key_service(args).create(project, admin=args.admin)
    print(token)
    kind = "admin key" if args.admin else "key"
    print(
        f"created {kind} {key.id} for project {key.project}; the key is shown only once",
        file=sys.stderr,
    )
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    keys = _key_service(args)
    admins = keys.admin_ids()
    for key in keys.list():
        state = "revoked" if key.revoked_at else "active"
        role = "\tadmin" if key.id in admins else ""
        print(f"{key.id}\t{key.project}\t{key.prefix}...\t{state}{role}")
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    key = _key_service(args).revoke(args.key_id)
    print(f"revoked {key.id} ({key.project})")
    return 0


def cmd_db_upgrade(args: argparse.Namespace) -> int:
    """Migrate the database to this release's schema (``serve`` does it at start-up too)."""
    import logging

    from shellbox.store import create_database
    from shellbox.store.migrate import current, head, upgrade

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    settings = _settings(args)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    db = create_database(settings.database_url(), migrate=False)
    try:
        before = current(db.engine)
        upgrade(db.engine, args.revision)
        after = current(db.engine)
    finally:
        db.dispose()
    state = "already at" if before == after else f"migrated from {before or 'nothing'} to"
    print(f"database {state} revision {after} (newest: {head()})")
    return 0


def cmd_db_current(args: argparse.Namespace) -> int:
    from shellbox.store import create_database
    from shellbox.store.migrate import current, head

    settings = _settings(args)
    settings.state_dir.mkdir(parents=True, exist_ok=True)
    db = create_database(settings.database_url(), migrate=False)
    try:
        revision = current(db.engine)
    finally:
        db.dispose()
    print(f"{revision or 'none'} (newest: {head()})")
    return 0


def cmd_patch(args: argparse.Namespace) -> int:
    """Apply a ``*** Begin Patch`` envelope to a container's /mnt/data (all or nothing)."""
    from shellbox.errors import ContainerNotFound, InvalidRequest
    from shellbox.patch import PatchError, parse_patch
    from shellbox.sandbox import storage_config, uid_ranges
    from shellbox.sandbox.crun import OciRuntime
    from shellbox.sandbox.image import image_for

    settings = _settings(args)
    text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
    try:
        ops = parse_patch(text)
    except PatchError as exc:
        msg = f"{args.file}: {exc}"
        raise InvalidRequest(msg) from None
    runtime = OciRuntime(
        settings.state_dir,
        image_for(settings.image_dir(), settings.runtime.image_profile).path,
        storage_config=storage_config(settings),
        uid_ranges=uid_ranges(settings),
    )
    if not (runtime.container_dir(args.container) / "spec.json").exists():
        msg = f"no container {args.container!r} in {settings.state_dir}"
        raise ContainerNotFound(msg)
    result = asyncio.run(runtime.apply_patch(args.container, ops))
    print(result.output, file=sys.stdout if result.completed else sys.stderr)
    return 0 if result.completed else 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="shellbox", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run commands in a sandbox and print a shell_call_output")
    _add_common(run)
    run.add_argument("--timeout-ms", type=int, default=None)
    run.add_argument("--max-output-length", type=int, default=None)
    run.add_argument("--memory-limit", choices=["1g", "4g", "16g", "64g"], default="1g")
    run.add_argument("--keep", action="store_true", help="keep the container; print its id")
    run.add_argument("--container", help="run in this existing container")
    run.add_argument(
        "--snapshot",
        metavar="SNAP_ID",
        help="start the new container from this snapshot's files (a copy-on-write fork)",
    )
    run.add_argument("commands", nargs=argparse.REMAINDER, help="-- CMD [CMD ...]")
    run.set_defaults(func=cmd_run)

    shell = sub.add_parser(
        "shell", help="open an interactive terminal in a container of a running server"
    )
    shell.add_argument("container_id")
    shell.add_argument("--command", help="run this instead of the interactive bash")
    shell.add_argument("--base-url", help="the server's /v1 URL (env SHELLBOX_BASE_URL)")
    shell.add_argument("--api-key", help="the project's key (env SHELLBOX_API_KEY)")
    shell.set_defaults(func=cmd_shell)

    image = sub.add_parser("image", help="manage the sandbox image")
    image_sub = image.add_subparsers(dest="image_command", required=True)
    build = image_sub.add_parser("build", help="build the sandbox image (cached by recipe)")
    _add_common(build)
    profiles = ["minimal", "default", "full"]
    build.add_argument("--profile", choices=profiles, help="default: runtime.image_profile")
    build.add_argument("--force", action="store_true", help="rebuild even if cached")
    build.set_defaults(func=cmd_image_build)
    info = image_sub.add_parser("info", help="what an image contains, with versions")
    _add_common(info)
    info.add_argument("--profile", choices=profiles, help="default: runtime.image_profile")
    info.add_argument(
        "--markdown", action="store_true", help="a table of every built profile (the README's)"
    )
    info.set_defaults(func=cmd_image_info)

    serve = sub.add_parser("serve", help="run the OpenAI-compatible HTTP server")
    _add_common(serve)
    serve.add_argument("--host", default=None, help="address to bind (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default 8000)")
    serve.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite in state dir)")
    serve.add_argument("--upstream-base-url", help="OpenAI-compatible model endpoint (.../v1)")
    serve.add_argument("--upstream-api-key", help="its API key (or SHELLBOX_UPSTREAM__API_KEY)")
    serve.add_argument(
        "--upstream-dialect", choices=["chat", "responses"], help="its API (default: chat)"
    )
    serve.add_argument(
        "--egress-allow", action="append", metavar="PATTERN,...",
        help="organisation allowlist bounding every container's network_policy",
    )  # fmt: skip
    serve.add_argument(
        "--egress-upstream-ca", action="append", metavar="FILE",
        help="extra CA (PEM) trusted for upstream TLS, besides the system bundle",
    )  # fmt: skip
    serve.add_argument(
        "--egress-hosts-file", metavar="FILE", help="hosts-file overrides for upstream names"
    )
    serve.add_argument(
        "--role", choices=["all", "api"],
        help="'api': a replica that runs no sandbox and places containers on the nodes "
        "registered in the (PostgreSQL) database; default 'all': this machine's sandboxes",
    )  # fmt: skip
    serve.add_argument(
        "--cluster-key-file", metavar="FILE", help="the key replicas present to nodes (0600)"
    )
    serve.set_defaults(func=cmd_serve)

    node = sub.add_parser("node", help="run this machine's sandboxes for API servers (a node)")
    _add_common(node)
    node.add_argument(
        "--listen", type=_listen, required=True, help="HOST:PORT to serve the runtime on"
    )
    node.add_argument(
        "--cluster-key-file", required=True, help="the key API servers present (a 0600 file)"
    )
    node.add_argument("--database-url", help="where egress audit rows go (default: SQLite here)")
    node.add_argument("--advertise", help="the URL API servers reach this node at")
    node.add_argument("--name", help="this node's name in the cluster (default: hostname)")
    node.set_defaults(func=cmd_node)

    keys = sub.add_parser("keys", help="manage API keys")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    kc = keys_sub.add_parser("create", help="create a key for a project; prints it once")
    _add_common(kc)
    kc.add_argument("--project", help="the key's project (an admin key: default 'admin')")
    kc.add_argument(
        "--admin",
        action="store_true",
        help="also read the organization's usage, costs and /metrics",
    )
    kc.set_defaults(func=cmd_keys_create)
    kl = keys_sub.add_parser("list", help="list keys (never the keys themselves)")
    _add_common(kl)
    kl.set_defaults(func=cmd_keys_list)
    kr = keys_sub.add_parser("revoke", help="revoke a key by id")
    _add_common(kr)
    kr.add_argument("key_id")
    kr.set_defaults(func=cmd_keys_revoke)
    for p in (kc, kl, kr):
        p.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite in state dir)")

    db = sub.add_parser("db", help="manage the metadata database")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    up = db_sub.add_parser("upgrade", help="migrate the schema to this release's (or REVISION)")
    _add_common(up)
    up.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite in state dir)")
    up.add_argument("revision", nargs="?", default="head", help="target revision (default: head)")
    up.set_defaults(func=cmd_db_upgrade)
    cur = db_sub.add_parser("current", help="print the schema revision of the database")
    _add_common(cur)
    cur.add_argument("--database-url", help="SQLAlchemy URL (default: SQLite in state dir)")
    cur.set_defaults(func=cmd_db_current)

    patch = sub.add_parser("patch", help="apply a V4A patch envelope to a container's files")
    _add_common(patch)
    patch.add_argument("file", help="the patch file ('*** Begin Patch' ... ), or - for stdin")
    patch.add_argument("--container", required=True, help="container id")
    patch.set_defaults(func=cmd_patch)

    for register in _EXTRA_COMMANDS:
        register(sub)
    return parser


_EXTRA_COMMANDS: list[Any] = []


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except ShellboxError as exc:
        print(f"shellbox: error: {exc.message}", file=sys.stderr)
        return 2 if exc.status < 500 else 1
    except ValidationError as exc:  # settings from flags, environment or the config file
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
        )
        print(f"shellbox: error: invalid settings: {problems}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
