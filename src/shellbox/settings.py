"""Typed settings, one section per part of the system.

Precedence, highest first: explicit arguments (the CLI's flags, or ``Settings(...)`` in code),
then environment variables ``SHELLBOX_<SECTION>__<KEY>`` (and ``SHELLBOX_STATE_DIR``), then the
TOML file given by ``--config`` or ``SHELLBOX_CONFIG``, then the defaults below.
``load_settings()`` returns the object; nothing reads a global.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_STATE_DIR = Path("/var/lib/shellbox")
PRIVATE_DIR = "private"  # must match store/db.py
# ``full`` was the profile with Java, PHP, Ruby and Go before ``default`` replaced it.
IMAGE_PROFILE_ALIASES = {"full": "default"}


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class RuntimeSettings(_Section):
    type: Literal["crun", "runc"] = Field("crun", description="OCI runtime binary")
    image_profile: Literal["minimal", "default"] = Field(
        "default",
        description="sandbox image: 'default' has what OpenAI's hosted shell promises (Python "
        "3.11, Node.js 22.16, Java 17, PHP 8.2, Ruby 3.1, Go 1.23, data and media tools); "
        "'minimal' is small and quick to build (Python 3.11, Debian's Node.js 18). "
        "'full' is the old name of 'default'",
    )
    seccomp: bool = Field(True, description="apply the default seccomp profile")
    pids_limit: int = Field(1024, ge=16, description="processes per container")
    cpus: float = Field(1.0, gt=0, description="CPU quota per container, in cores")
    tmp_size_mb: int = Field(512, ge=1, description="size of the /tmp tmpfs, in MiB")
    image_dir: Path | None = Field(
        None, description="where images are cached; default: <state_dir>/images"
    )
    uid_range_first: int = Field(
        0x7000_0000,
        ge=1 << 17,
        description="first host uid of the pool of per-container uid ranges (65536 each, a "
        "multiple of 65536); must not overlap host users or /etc/subuid ranges",
    )
    uid_range_count: int = Field(
        4094, ge=1, description="container uid ranges in the pool: containers on the host at once"
    )
    uid_claims_dir: Path = Field(
        Path("/var/lib/shellbox-uid-ranges"),
        description="host-wide claims of uid ranges, shared by every shellbox server on the host",
    )

    @field_validator("image_profile", mode="before")
    @classmethod
    def _old_profile_names(cls, value: object) -> object:
        return IMAGE_PROFILE_ALIASES.get(value, value) if isinstance(value, str) else value


class LimitSettings(_Section):
    # The two defaults must match agent/protocol.py's DEFAULT_* (what the agent applies to a
    # request without them); tests/unit/service/test_shell_limits.py checks that they do.
    default_timeout_ms: int = Field(120_000, ge=1, description="per-command timeout default")
    max_timeout_ms: int = Field(300_000, ge=1, description="per-command timeout clamp")
    default_max_output_length: int = Field(16_384, ge=0, description="per-stream cap default")
    max_output_length: int = Field(65_536, ge=0, description="per-stream cap clamp")
    max_commands: int = Field(100, ge=1, le=100, description="commands per call")
    upload_max_bytes: int = Field(512 << 20, ge=1, description="largest upload, in bytes")
    max_containers_per_project: int = Field(100, ge=1, description="live containers per project")
    max_memory_gb_per_project: int = Field(256, ge=1, description="sum of memory limits, GiB")
    max_snapshots_per_project: int = Field(
        100, ge=0, description="snapshots a project may keep (they outlive their containers)"
    )
    max_snapshot_gb_per_project: float = Field(
        32,
        ge=0,
        description="snapshot bytes a project may hold, in GiB: each snapshot counts what its "
        "container's disk held when it was taken, and a deleted snapshot keeps counting while "
        "containers forked from it live (they still use its data); past it a snapshot answers "
        "429. The default is half of storage.size_gb's: even if every counted byte stopped "
        "being shared, one project's saved states would leave half the disks to containers",
    )
    disk_gb: float = Field(
        10,
        gt=0,
        description="disk quota per container, in GiB: its overlay's upper layer (/home/user and "
        "every other rootfs path) and /mnt/data together; past it writes fail with EDQUOT",
    )
    body_budget_bytes: int = Field(
        256 << 20,
        ge=1 << 20,
        description="request bodies (JSON over 1 MiB) the server holds at once, in bytes: a "
        "call of 100 commands of 1 MiB is ~100 MiB; past the budget a request waits, unread, "
        "for room (see body_budget_wait_s). Server memory grows by about twice this at most",
    )
    body_budget_wait_s: float = Field(
        60,
        ge=0,
        description="how long a request waits for room in body_budget_bytes before it is "
        "answered 429 server_busy",
    )
    # The agent's own cap (agent/protocol.py MAX_PTYS, 32) bounds this.
    max_ptys_per_container: int = Field(
        8, ge=1, le=32, description="terminals (GET .../pty) open at once per container"
    )
    ws_max_message_bytes: int = Field(
        1 << 20,
        ge=1024,
        description="largest WebSocket message the server takes (a terminal's paste), in "
        "bytes; a larger one closes the socket with 1009",
    )


class LifecycleSettings(_Section):
    idle_sleep_s: float = Field(300, gt=0, description="idle seconds before a container sleeps")
    default_expiry_minutes: int = Field(20, ge=1, le=10_080, description="expires_after default")
    reaper_interval_s: float = Field(5, gt=0, description="how often the reaper looks")
    warm_pool_size: int = Field(
        2, ge=0, le=64, description="started containers kept ready for fast creation (0: off)"
    )
    minute_s: float = Field(
        60,
        gt=0,
        description="seconds in one expires_after minute; lower it only to expire containers "
        "within seconds in tests (the API's smallest expiry is 1 minute)",
    )
    files_purge_interval_s: float = Field(
        60, ge=0, description="how often expired Files API files are deleted from disk"
    )
    idempotency_ttl_s: float = Field(
        86_400, gt=0, description="how long an Idempotency-Key's result is kept for retries"
    )
    snapshot_expires_after_days: float = Field(
        30,
        gt=0,
        description="days a snapshot is kept after it was last used (taken, or forked: a fork "
        "counts as use); then it is deleted as DELETE /v1/snapshots/{id} would (forks of it "
        "keep their files). A fraction of a day is allowed (tests use seconds)",
    )
    idle_sleep: Literal["freeze", "stop"] = Field(
        "freeze",
        description="how an idle container sleeps: 'freeze', its processes frozen with their "
        "memory (cgroup freezer; a background service survives and answers after the next "
        "call); 'stop', its processes ended and its memory freed (its files stay)",
    )


class StorageSettings(_Section):
    backend: Literal["btrfs", "none"] = Field(
        "btrfs",
        description="where containers' writable state lives: 'btrfs', a subvolume per container "
        "with its limits.disk_gb quota; 'none', plain directories on the state directory's "
        "filesystem, with no disk quota",
    )
    device: Path | None = Field(
        None,
        description="a block device or image file holding a btrfs for the containers' disks; "
        "default: <state_dir>/disks.img, a sparse image made on first start",
    )
    size_gb: float = Field(
        64,
        gt=0,
        description="size of the default image: the most all containers together may hold "
        "(sparse: host space is used as containers write, and given back as they delete)",
    )
    quota_mode: Literal["auto", "simple", "qgroup"] = Field(
        "auto",
        description="btrfs quota kind: 'simple' (Linux 6.7+, usage counted as extents are "
        "allocated and freed), 'qgroup' (regular qgroups, any kernel), 'auto' (simple where "
        "the kernel has them); a filesystem keeps the kind it was first given",
    )


class ServerSettings(_Section):
    host: str = Field("127.0.0.1", description="address to bind")
    port: int = Field(8000, ge=0, le=65535, description="port to bind")


class StoreSettings(_Section):
    database_url: SecretStr | None = Field(
        None, description="SQLAlchemy URL; default: SQLite in the state directory"
    )

    @field_validator("database_url")
    @classmethod
    def _check_url(cls, v: SecretStr | None) -> SecretStr | None:
        if v is None:
            return v
        raw = v.get_secret_value()
        if not raw.startswith(("sqlite", "postgresql")):
            msg = "store.database_url must be sqlite:///... or postgresql+psycopg://..."
            raise ValueError(msg)
        return v


class EgressSettings(_Section):
    allow: list[str] | None = Field(None, description="organisation allowlist (globs)")
    upstream_ca: list[Path] = Field(default_factory=list, description="extra upstream CAs")
    hosts_file: Path | None = Field(None, description="hosts-file overrides for upstreams")
    proxy_port: int = Field(0, ge=0, le=65535, description="proxy port (0: pick one)")
    enabled: bool = Field(True, description="offer allowlist network policies at all")
    prestart: bool = Field(
        False, description="start the proxy at boot (default: with the first allowlist container)"
    )
    pool_size: int = Field(4, ge=0, le=256, description="warm network namespaces kept ready")
    warm_containers: int = Field(
        1,
        ge=0,
        le=64,
        description="started containers kept ready in their own egress namespace, once the "
        "proxy runs, so that creating an allowlist container costs no container start (0: off)",
    )
    subnet: str = Field("10.200.0.0/16", description="IPv4 range carved into /30s for sandboxes")
    python: Path | None = Field(
        None, description="the proxy's Python (mitmproxy 11); default: .venv-egress/bin/python"
    )
    secrets_key_file: Path | None = Field(
        None,
        description="the key that encrypts domain_secrets in the database (created 0600 at the "
        "first start; keep it out of database backups); default: <state_dir>/private/secrets.key",
    )
    intercept: Literal["all", "secrets"] = Field(
        "all",
        description="decrypt all HTTPS (audit per request), or only for hosts with a "
        "domain_secret ('secrets': other hosts are tunnelled, faster, audited per connection)",
    )


class UpstreamSettings(_Section):
    base_url: str | None = Field(None, description="OpenAI-compatible upstream base URL")
    api_key: SecretStr | None = Field(None, description="upstream API key")
    dialect: Literal["chat", "responses"] = Field("chat", description="upstream API dialect")
    timeout_s: float = Field(120, gt=0, description="upstream request timeout")
    models: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="model name -> {base_url, api_key, dialect, model}"
    )
    # Per-request caps of the server-side tool loop (/v1/responses, /v1/messages).
    max_iterations: int = Field(
        24, ge=1, description="model turns per response; past it the response is incomplete"
    )
    max_sandbox_s: float = Field(
        1800, gt=0, description="sandbox seconds (sum over a response's tool calls)"
    )
    max_tool_output_chars: int = Field(
        2_000_000, ge=1, description="characters of tool output one response may feed back"
    )


class MeteringSettings(_Section):
    """Sandbox time, as OpenRouter prices its shell: see the README's "Metering" section."""

    price_per_second_usd: float = Field(
        0.0001, ge=0, description="price of one second of sandbox time, in US dollars"
    )
    minimum_s: float = Field(
        30, ge=0, description="seconds billed at least to a request that starts a container"
    )


class SkillSettings(_Section):
    max_files: int = Field(500, ge=1, description="files in one skill bundle")
    max_file_bytes: int = Field(25 << 20, ge=1, description="largest file in a bundle, bytes")
    max_bundle_bytes: int = Field(
        50 << 20, ge=1, description="largest bundle (upload, and total unpacked), in bytes"
    )
    max_expansion_ratio: int = Field(
        200, ge=2, description="unpacked/packed size past which a zip is refused as a bomb"
    )
    max_per_container: int = Field(20, ge=1, description="skills mounted in one container")


class ClusterSettings(_Section):
    """Many machines: API replicas (``role = "api"``) in front of sandbox nodes, sharing one
    PostgreSQL database (README, "Many machines")."""

    role: Literal["all", "api"] = Field(
        "all",
        description="'all': one server runs the API and the sandboxes of this machine (the "
        "default); 'api': a replica that runs no sandbox and places containers on the sandbox "
        "nodes registered in the database (needs PostgreSQL and cluster.key_file)",
    )
    key_file: Path | None = Field(
        None,
        description="the file holding the cluster key replicas present to nodes (keep it 0600; "
        "the same file on every replica and node)",
    )
    node_timeout_s: float = Field(
        15,
        gt=0,
        description="a node silent this long (no heartbeat) is lost: its containers answer 503 "
        "node_unavailable and new containers go to other nodes, until it is back",
    )
    heartbeat_s: float = Field(
        3, gt=0, description="how often a node reports itself alive (well under node_timeout_s)"
    )
    node_memory_gb: float | None = Field(
        None,
        gt=0,
        description="memory a node offers its containers, the sum of their memory_limit "
        "(placement's first rule); default: the machine's",
    )
    node_url: str | None = Field(
        None,
        description="run this server's sandboxes on the `shellbox node` at this URL instead of "
        "this machine (one node; placement over many is the api role's)",
    )
    node_connect_timeout_s: float = Field(
        3.0, gt=0, description="how long reaching a node may take before it is unavailable"
    )
    tls_cert_file: Path | None = Field(
        None,
        description="`shellbox node` serves https with this certificate chain (PEM), so the "
        "cluster key and the sandboxes' traffic cross the network encrypted; needs "
        "tls_key_file",
    )
    tls_key_file: Path | None = Field(
        None,
        description="the private key of tls_cert_file (PEM; root's alone, 0600, or the node "
        "refuses to start)",
    )
    node_ca_file: Path | None = Field(
        None,
        description="the CA certificates (PEM) an https node's certificate is checked against; "
        "default: the system's trust store",
    )


class PortSettings(_Section):
    """Services inside containers, reached through ``/v1/containers/{id}/ports/{port}/``."""

    link_default_s: int = Field(3600, ge=1, description="life of a port link, in seconds")
    link_max_s: int = Field(
        7 * 24 * 3600, ge=1, description="longest life a port link may ask for, in seconds"
    )
    browser_token_s: int = Field(
        60, ge=1, description="life of a browser's query-string token (PTY), in seconds"
    )
    head_timeout_s: float = Field(
        300, gt=0, description="how long a service may take to start its answer, in seconds"
    )
    max_ws_message_bytes: int = Field(
        16 << 20, ge=1024, description="largest WebSocket message relayed, in bytes"
    )
    sandbox_links: bool = Field(
        True,
        description="answer pages opened through a link with 'Content-Security-Policy: "
        "sandbox' so their scripts run in an opaque origin and cannot act on the console "
        "session of the same server; turn off only for services that need their own origin",
    )
    signing_key_file: Path | None = Field(
        None,
        description="HMAC key of links, browser tokens and console sessions (0600, made "
        "when missing); default: <state_dir>/private/signing.key",
    )


class ConsoleSettings(_Section):
    session_s: int = Field(
        8 * 3600, ge=60, description="life of an operator console session, in seconds"
    )


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="SHELLBOX_", env_nested_delimiter="__", extra="forbid"
    )

    state_dir: Path = Field(DEFAULT_STATE_DIR, description="where containers, images, db live")
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    limits: LimitSettings = Field(default_factory=LimitSettings)
    lifecycle: LifecycleSettings = Field(default_factory=LifecycleSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    server: ServerSettings = Field(default_factory=ServerSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    egress: EgressSettings = Field(default_factory=EgressSettings)
    upstream: UpstreamSettings = Field(default_factory=UpstreamSettings)
    skills: SkillSettings = Field(default_factory=SkillSettings)
    metering: MeteringSettings = Field(default_factory=MeteringSettings)
    cluster: ClusterSettings = Field(default_factory=ClusterSettings)
    ports: PortSettings = Field(default_factory=PortSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)

    def image_dir(self) -> Path:
        return self.runtime.image_dir or self.state_dir / "images"

    def disk_limit_bytes(self) -> int:
        return int(self.limits.disk_gb * (1 << 30))

    def private_dir(self) -> Path:
        """Root only (0700): the database and the secrets key. The state directory itself
        stays traversable (0711): the containers' root uid must reach its rootfs in it."""
        return self.state_dir / PRIVATE_DIR

    def secrets_key_file(self) -> Path:
        return self.egress.secrets_key_file or self.private_dir() / "secrets.key"

    def signing_key_file(self) -> Path:
        return self.ports.signing_key_file or self.private_dir() / "signing.key"

    def database_url(self) -> str:
        if self.store.database_url is not None:
            return self.store.database_url.get_secret_value()
        return f"sqlite:///{self.private_dir() / 'shellbox.db'}"


def load_settings(config: Path | None = None, **overrides: Any) -> Settings:
    """Settings from (in rising precedence) defaults, a TOML file, the environment, overrides."""
    path = config or (
        Path(os.environ["SHELLBOX_CONFIG"]) if "SHELLBOX_CONFIG" in os.environ else None
    )
    file_values: dict[str, Any] = {}
    if path is not None:
        with open(path, "rb") as f:
            file_values = tomllib.load(f)
    env_settings = Settings()  # defaults + environment
    merged = _deep_merge(file_values, env_settings.model_dump(exclude_unset=True))
    merged = _deep_merge(merged, {k: v for k, v in overrides.items() if v is not None})
    return Settings(**merged)


def _deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in top.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = _deep_merge(out[k], v)
        else:
            out[k] = v
    return out
