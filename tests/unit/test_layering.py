"""The imports are the layering of design.md: no import circle anywhere in ``src/`` (type-only
imports included), and no module imports from a layer above its own.

Layers, top down (a module may import its own layer and those below):

    app, cli                      the entry points
    api, node                     HTTP: the API's routes, schemas, errors; a node's runtime
    services                      the one composition root
    responses                     the Responses feature, which runs calls through service
    service                       orchestration of containers, files, calls
    egress, skills, features,     features container creation calls (through the protocol
    sandbox, store, patch, agent  in ``features``), runtimes, persistence, pure libraries
    settings, errors, ids,        what everything shares
    principal, memory

This is design.md's api -> service -> {store, sandbox, egress, skills, patch, agent}: egress
and skills sit beside store and sandbox, and import nothing from service or above.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "shellbox"
LAYERS = [
    {"app", "cli", "__main__", "integrations", "client"},
    {"api", "node"},
    {"services"},
    {"responses"},
    {"service"},
    {"egress", "skills", "features", "sandbox", "store", "patch", "agent", "cluster"},
    {"settings", "errors", "ids", "types", "memory", "principal", "__init__"},
]


def _modules() -> dict[str, Path]:
    found = {}
    for path in SRC.rglob("*.py"):
        parts = list(path.relative_to(SRC.parent).with_suffix("").parts)
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                deps |= {r for a in node.names if (r := resolve(a.name))}
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                deps |= {r for a in node.names if (r := resolve(f"{node.module}.{a.name}"))}
        deps.discard(name)
        graph[name] = deps
    return graph


def _layer(module: str) -> int:
    top = module.split(".")[1] if "." in module else "__init__"
    for i, names in enumerate(LAYERS):
        if top in names:
            return i
    raise AssertionError(f"{module} is in no layer; add its package to LAYERS")


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle() -> None:
    assert _cycles(_graph()) == []


def test_no_import_from_a_higher_layer() -> None:
    wrong = [
        f"{module} imports {dep}"
        for module, deps in sorted(_graph().items())
        for dep in sorted(deps)
        if _layer(dep) < _layer(module)
    ]
    assert wrong == [], "\n".join(wrong)


def test_the_checks_catch_what_they_must() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _layer("shellbox.service.files") > _layer("shellbox.api.routes.files")
    assert _layer("shellbox.sandbox.crun") > _layer("shellbox.service.containers")
    assert _layer("shellbox.egress.service") > _layer("shellbox.service.containers")
    assert _layer("shellbox.skills.mounts") > _layer("shellbox.service.containers")
    assert _layer("shellbox.skills") == _layer("shellbox.store") == _layer("shellbox.sandbox")
    assert _layer("shellbox.node.app") == _layer("shellbox.api.routes.files")
    assert _layer("shellbox.node.app") < _layer("shellbox.sandbox.remote")
