"""The ``Runtime`` protocol is the only way from the service layer to a sandbox: no module
above ``sandbox/`` imports a driver or its host-side helpers (``OciRuntime``, the data
directory walk, the agent's client), no host path of the runtime's machine crosses it (no
``Mount``, no network namespace: skills, files and networks go by value), and the runtime
contract suite calls every method of the protocol."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from shellbox.sandbox.base import Runtime

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "shellbox"
# The service layer and the features it drives (the CLI and the composition root's factory,
# ``sandbox.create_runtime``, may name the driver).
ABOVE_THE_SEAM = [
    SRC / "services.py",
    SRC / "app.py",
    *(SRC / "service").glob("*.py"),
    *(SRC / "skills").glob("*.py"),
    *(SRC / "responses").glob("*.py"),
    *(SRC / "egress").glob("*.py"),
    *(SRC / "api").rglob("*.py"),
]
# The driver's side of features, injected into the driver by the composition root: they run
# on the sandboxes' machine and deal in its paths.
DRIVER_COLLABORATORS = {
    SRC / "egress" / name
    for name in ("network.py", "netns.py", "supervisor.py", "paths.py", "addon.py", "proxy_main.py")
}
DRIVER_SIDE = {
    "shellbox.sandbox.crun",
    "shellbox.sandbox.datafs",
    "shellbox.sandbox.host_files",
    "shellbox.sandbox.patch_files",
    "shellbox.sandbox.storage",
    "shellbox.sandbox.cgroups",
    "shellbox.agent.client",
}


def _imports(path: Path) -> set[str]:
    """Modules (and ``module.name`` for ``from module import name``) a file imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return found


def test_nothing_above_the_seam_reaches_a_driver() -> None:
    wrong = []
    for path in sorted(ABOVE_THE_SEAM):
        imported = _imports(path)
        bad = {m for m in imported if m in DRIVER_SIDE or m.endswith(".OciRuntime")}
        if bad:
            wrong.append(f"{path.relative_to(ROOT)}: {sorted(bad)}")
    assert wrong == [], "\n".join(wrong)


def test_the_contract_suite_calls_every_runtime_method() -> None:
    methods = {
        name
        for name, member in inspect.getmembers(Runtime)
        if not name.startswith("_") and callable(member)
    }
    suite = ROOT / "tests" / "sandbox" / "test_runtime_contract.py"
    called = {
        node.attr
        for node in ast.walk(ast.parse(suite.read_text()))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "rt"
    }
    assert methods - called == set()
    assert len(methods) >= 25  # lifecycle, commands and files


# Names that are host paths of the runtime's machine: a ``Mount`` (its ``source``), the
# ``mounts`` of a spec, a network namespace's path.
HOST_PATH_NAMES = {"Mount", "mounts", "netns_path"}


def host_path_uses(source: str, filename: str = "<src>") -> list[str]:
    """Where a module names a host path of the runtime's machine: imports or builds a
    ``Mount``, passes ``mounts=``/``netns_path=``, or reads or sets such an attribute."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.ImportFrom) and node.module:
            found += [f"imports {a.name}" for a in node.names if a.name in HOST_PATH_NAMES]
        elif isinstance(node, ast.Name) and node.id in HOST_PATH_NAMES:
            found.append(f"line {node.lineno}: {node.id}")
        elif isinstance(node, ast.Attribute) and node.attr in HOST_PATH_NAMES:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.keyword) and node.arg in HOST_PATH_NAMES:
            found.append(f"line {node.value.lineno}: {node.arg}=")
    return found


def test_no_host_path_crosses_the_seam() -> None:
    wrong = []
    for path in sorted(set(ABOVE_THE_SEAM) - DRIVER_COLLABORATORS):
        uses = host_path_uses(path.read_text(), str(path))
        if uses:
            wrong.append(f"{path.relative_to(ROOT)}: {uses}")
    assert wrong == [], "\n".join(wrong)


def test_the_host_path_check_catches_what_it_must() -> None:
    assert host_path_uses("from shellbox.sandbox import Mount")
    assert host_path_uses("prov.mounts.append(x)")
    assert host_path_uses("ContainerSpec(id=c, netns_path=slot.netns_path)")
    assert host_path_uses("spec = replace(spec, mounts=(m,))")
    assert host_path_uses("m = sandbox.Mount(Path('/srv/x'), '/mnt/x')")
    assert host_path_uses("ContainerSpec(id=c, skills=(SkillMount(k, d),))") == []
