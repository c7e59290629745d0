"""Network namespaces for allowlisted containers: veth pairs, nftables rules, a warm pool.

Each allowlisted container joins a namespace of its own, ``/run/netns/sbe<N>``, holding
loopback and ``eth0``, one end of a veth pair whose other end ``sbe<N>`` stays on the host.
Slot ``N`` owns the /30 at ``subnet + 4N``: the host end is ``.1``, the sandbox ``.2``, and the
sandbox's only route beyond its /30 is a default route via the host end. The proxy listens on
the host and tells containers apart by that source address.

nftables (table ``inet shellbox``, shared by every shellbox server on the host, its rules the
same for all) lets a sandbox's packets reach exactly one thing: its host end's address on its
server's proxy port (the ``peers`` set holds ``interface . source . destination . port``).
Everything else from a sandbox interface is refused with a reset or an ICMP error, so that a
tool in the sandbox fails at once instead of hanging: on input (other host addresses, services
bound to 0.0.0.0 or 127.0.0.1, UDP, ICMP, IPv6), and before routing for any address that is
not this host's. Nothing is forwarded to or from a sandbox (and ``ip_forward`` is left alone,
0 here), the host opens no connection into one, and the proxy ports answer no other interface.

Slot numbers are claimed host-wide with ``O_EXCL`` files in ``/run/shellbox/egress-slots`` (the
file holds its server's key), so servers sharing a host never collide. Creating a namespace
costs ~15-40 ms of ``ip`` calls; a warm pool keeps creation of a container off that path.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import ipaddress
import logging
import os
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from shellbox.errors import SandboxError

log = logging.getLogger("shellbox.egress")

PREFIX = "sbe"  # host-side interface and namespace names; must match IFACES below
IFACES = '"sbe*"'
TABLE = "shellbox"
MARKER = "shellbox egress v3"  # bump when the rules below change
SLOT_DIR = Path("/run/shellbox/egress-slots")
NETNS_DIR = Path("/run/netns")
SANDBOX_IF = "eth0"

RULES = f"""
table inet {TABLE} {{
  comment "{MARKER}"
  set peers {{
    type ifname . ipv4_addr . ipv4_addr . inet_service
  }}
  set ports {{
    type inet_service
  }}
  chain input {{
    type filter hook input priority filter - 10; policy accept;
    iifname {IFACES} jump from_sandbox
    tcp dport @ports drop
  }}
  chain from_sandbox {{
    iifname . ip saddr . ip daddr . tcp dport @peers accept
    meta l4proto tcp reject with tcp reset
    reject with icmpx admin-prohibited
  }}
  chain prerouting {{
    type filter hook prerouting priority filter - 10; policy accept;
    iifname {IFACES} fib daddr type != local meta l4proto tcp reject with tcp reset
    iifname {IFACES} fib daddr type != local reject with icmpx admin-prohibited
  }}
  chain forward {{
    type filter hook forward priority filter - 10; policy accept;
    iifname {IFACES} drop
    oifname {IFACES} drop
  }}
  chain output {{
    type filter hook output priority filter - 10; policy accept;
    oifname {IFACES} tcp flags rst accept
    oifname {IFACES} meta l4proto {{ icmp, ipv6-icmp }} accept
    oifname {IFACES} ct state new drop
  }}
}}
"""


@dataclass(frozen=True)
class Slot:
    """One namespace and its addresses."""

    index: int
    network: ipaddress.IPv4Network  # the /30

    @property
    def name(self) -> str:
        return f"{PREFIX}{self.index}"

    @property
    def host_ip(self) -> str:
        return str(self.network.network_address + 1)

    @property
    def sandbox_ip(self) -> str:
        return str(self.network.network_address + 2)

    @property
    def netns_path(self) -> str:
        return str(NETNS_DIR / self.name)


async def run(*argv: str, stdin: str | None = None, check: bool = True) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
    if check and proc.returncode != 0:
        text = err.decode(errors="replace").strip()[-1000:]
        msg = f"egress network set-up failed: {' '.join(argv[:3])}: {text}"
        raise SandboxError(msg)
    return out.decode(errors="replace")


@dataclass(frozen=True)
class Claim:
    """What a slot's claim file says: whose it is, where that server keeps its state, and
    its proxy port (to find the slot's nftables element)."""

    owner: str
    state_dir: str = ""
    port: int = 0

    def text(self) -> str:
        return f"{self.owner}\n{self.state_dir}\n{self.port}\n"

    @classmethod
    def read(cls, path: Path) -> Claim | None:
        try:
            lines = path.read_text().splitlines()
        except OSError:
            return None
        if not lines:
            return None
        port = lines[2] if len(lines) > 2 and lines[2].isdigit() else "0"
        return cls(lines[0], lines[1] if len(lines) > 1 else "", int(port))


@contextlib.contextmanager
def _host_lock() -> Iterator[None]:
    """Serialize table creation and removal among the servers of this host."""
    SLOT_DIR.mkdir(parents=True, exist_ok=True)
    fd = os.open(SLOT_DIR / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


class Firewall:
    """The ``inet shellbox`` table: created once per host, filled per server and per slot."""

    async def ensure(self) -> None:
        with _host_lock():
            current = await run("nft", "list", "table", "inet", TABLE, check=False)
            if MARKER in current:
                return
            if current.strip():
                log.warning("replacing an older nftables table inet %s", TABLE)
                await run("nft", "delete", "table", "inet", TABLE)
            await run("nft", "-f", "-", stdin=RULES)

    @staticmethod
    async def _element(verb: str, set_name: str, element: str, *, check: bool = True) -> None:
        await run("nft", verb, "element", "inet", TABLE, set_name, f"{{ {element} }}", check=check)

    async def open_port(self, port: int) -> None:
        await self._element("add", "ports", str(port))

    async def close_port(self, port: int) -> None:
        await self._element("delete", "ports", str(port), check=False)

    @staticmethod
    def _peer(slot: Slot, port: int) -> str:
        return f'"{slot.name}" . {slot.sandbox_ip} . {slot.host_ip} . {port}'

    async def add_peer(self, slot: Slot, port: int) -> None:
        await self._element("add", "peers", self._peer(slot, port))

    async def remove_peer(self, slot: Slot, port: int) -> None:
        await self._element("delete", "peers", self._peer(slot, port), check=False)

    async def drop_if_unused(self) -> None:
        """Remove the table once no server on this host uses it."""
        with _host_lock():
            listing = await run("nft", "list", "table", "inet", TABLE, check=False)
            if MARKER in listing and "elements" not in listing:
                await run("nft", "delete", "table", "inet", TABLE, check=False)


class NetnsPool:
    """Hands out ready namespaces; refills in the background."""

    def __init__(
        self,
        *,
        subnet: str,
        owner: str,
        port: int,
        size: int,
        state_dir: str = "",
        firewall: Firewall | None = None,
    ) -> None:
        self.subnet = ipaddress.IPv4Network(subnet)
        if self.subnet.prefixlen > 29:
            msg = f"egress.subnet {subnet} is too small: it needs room for /30 slots"
            raise ValueError(msg)
        self.capacity = self.subnet.num_addresses // 4
        self.owner = owner
        self.state_dir = state_dir
        self.port = port
        self.size = size
        self.firewall = firewall or Firewall()
        self._warm: deque[Slot] = deque()
        self._fill_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[None]] = set()
        self._next = 0

    @staticmethod
    def slot_for(subnet: str, index: int) -> Slot:
        base = ipaddress.IPv4Network(subnet).network_address + 4 * index
        return Slot(index, ipaddress.IPv4Network(f"{base}/30"))

    def slot(self, index: int) -> Slot:
        return self.slot_for(str(self.subnet), index)

    # -- claims -----------------------------------------------------------------------------

    def _claim(self, index: int) -> bool:
        SLOT_DIR.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(SLOT_DIR / str(index), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w") as f:
            f.write(Claim(self.owner, self.state_dir, self.port).text())
        return True

    def _claim_free(self) -> int:
        for i in range(self.capacity):
            index = (self._next + i) % self.capacity
            if self._claim(index):
                self._next = index + 1
                return index
        msg = f"no free egress network slot left in {self.subnet}"
        raise SandboxError(msg)

    @staticmethod
    def claims() -> dict[int, Claim]:
        out: dict[int, Claim] = {}
        if SLOT_DIR.is_dir():
            for entry in SLOT_DIR.iterdir():
                claim = Claim.read(entry) if entry.name.isdigit() else None
                if claim is not None:
                    out[int(entry.name)] = claim
        return out

    def owned(self) -> list[int]:
        """Slots this server claimed (also the ones a crash left behind)."""
        return sorted(i for i, c in self.claims().items() if c.owner == self.owner)

    async def collect_orphans(self) -> None:
        """Remove the slots of servers whose state directory is gone: their containers went
        with it (e.g. a test run whose server was stopped and its directory deleted) and no
        server can ever come back for them."""
        claims = self.claims()
        orphans = {
            i: c
            for i, c in claims.items()
            if c.owner != self.owner and c.state_dir and not Path(c.state_dir).exists()
        }
        for index, claim in orphans.items():
            log.info("removing egress namespace sbe%d of a server that is gone", index)
            await self.firewall.remove_peer(self.slot(index), claim.port)
            await self._remove_links(self.slot(index))
            (SLOT_DIR / str(index)).unlink(missing_ok=True)
        in_use = {self.port} | {c.port for i, c in claims.items() if i not in orphans}
        for port in {c.port for c in orphans.values()} - in_use:
            await self.firewall.close_port(port)

    # -- one namespace ----------------------------------------------------------------------

    async def _create(self, slot: Slot) -> None:
        await self._remove_links(slot)  # a leftover of the same name would fail the batch
        await run(
            "ip",
            "-batch",
            "-",
            stdin=(
                f"netns add {slot.name}\n"
                f"link add {slot.name} type veth peer name {SANDBOX_IF} netns {slot.name}\n"
                f"addr add {slot.host_ip}/30 dev {slot.name}\n"
                f"link set {slot.name} up\n"
            ),
        )
        with contextlib.suppress(OSError):
            Path(f"/proc/sys/net/ipv6/conf/{slot.name}/disable_ipv6").write_text("1")
        await run(
            "ip",
            "-n",
            slot.name,
            "-batch",
            "-",
            stdin=(
                f"addr add {slot.sandbox_ip}/30 dev {SANDBOX_IF}\n"
                "link set lo up\n"
                f"link set {SANDBOX_IF} up\n"
                f"route add default via {slot.host_ip}\n"
            ),
        )
        await self.firewall.add_peer(slot, self.port)

    @staticmethod
    async def _remove_links(slot: Slot) -> None:
        await run(
            "ip",
            "-force",
            "-batch",
            "-",
            stdin=f"link del {slot.name}\nnetns del {slot.name}\n",
            check=False,
        )

    async def _new(self) -> Slot:
        slot = self.slot(self._claim_free())
        try:
            await self._create(slot)
        except BaseException:
            await self.destroy(slot)
            raise
        return slot

    async def destroy(self, slot: Slot) -> None:
        """Remove the namespace, its veth, its rule, and give the number back."""
        await self.firewall.remove_peer(slot, self.port)
        await self._remove_links(slot)
        (SLOT_DIR / str(slot.index)).unlink(missing_ok=True)

    def exists(self, slot: Slot) -> bool:
        return Path(slot.netns_path).exists() and Path(f"/sys/class/net/{slot.name}").exists()

    async def ensure(self, index: int) -> Slot:
        """The namespace of a container that already had one (after a restart or reboot)."""
        slot = self.slot(index)
        claim = SLOT_DIR / str(index)
        held = Claim.read(claim)
        mine = self._claim(index) or (held is not None and held.owner == self.owner)
        if not mine:
            msg = f"egress network slot {index} is taken by another shellbox server on this host"
            raise SandboxError(msg)
        if not self.exists(slot):
            await self._create(slot)
        else:
            await self.firewall.add_peer(slot, self.port)
        return slot

    # -- the pool ---------------------------------------------------------------------------

    async def start(self, keep: Iterable[int]) -> None:
        """Set up the table, forget what a previous run of this server left (except ``keep``,
        the slots of live containers), and fill the pool."""
        await self.firewall.ensure()
        await self.firewall.open_port(self.port)
        await self.collect_orphans()
        keep = set(keep)
        for index in self.owned():
            slot = self.slot(index)
            if index not in keep:
                await self.destroy(slot)
            elif self.exists(slot):
                await self.firewall.add_peer(slot, self.port)  # the table may be new
        await self.fill()

    async def fill(self) -> None:
        async with self._fill_lock:
            while len(self._warm) < self.size:
                self._warm.append(await self._new())

    def _refill_soon(self) -> None:
        task = asyncio.create_task(self._refill())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _refill(self) -> None:
        try:
            await self.fill()
        except Exception:
            log.exception("refilling the egress namespace pool failed")

    async def acquire(self) -> Slot:
        slot = self._warm.popleft() if self._warm else await self._new()
        self._refill_soon()
        return slot

    def release_soon(self, slot: Slot) -> None:
        """Tear a used namespace down in the background (never reused: a fresh one is cheap
        to make, and nothing of the old container's network state can linger)."""

        async def go() -> None:
            try:
                await self.destroy(slot)
            except Exception:
                log.exception("removing egress namespace %s failed", slot.name)

        task = asyncio.create_task(go())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Remove the warm namespaces; the ones containers use stay for the next run."""
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError):  # ``go`` logs its own failures
                await task
        while self._warm:
            await self.destroy(self._warm.popleft())
        await self.firewall.close_port(self.port)
        await self.firewall.drop_if_unused()
