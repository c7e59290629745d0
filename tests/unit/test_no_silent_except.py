"""No silent broad ``except`` in ``src/``: a handler that catches ``Exception``,
``BaseException`` or everything (bare, or in a tuple) either re-raises what it caught or
reports it (a log call; in the agent and in a forked child, a write to stderr, a ``fail``
answer to the peer, or ``_exit``). Raising another error instead does not count: that is
how a bug becomes a client's 400. ``contextlib.suppress`` of a broad class is never allowed
(it cannot log). Narrow handlers (``OSError``, ``FileNotFoundError``) are the code's to
judge."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "shellbox"
BROAD = {"Exception", "BaseException"}
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


def _names(node: ast.expr | None) -> set[str]:
    if node is None:
        return {"BaseException"}  # a bare ``except:``
    if isinstance(node, ast.Tuple):
        return set().union(*(_names(e) for e in node.elts))
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.Attribute):
        return {node.attr}
    return set()


def _reports(handler: ast.ExceptHandler) -> bool:
    """Whether the handler re-raises what it caught or reports it."""
    for stmt in handler.body:
        for node in ast.walk(stmt):
            if isinstance(node, ast.Raise) and (
                node.exc is None or (isinstance(node.exc, ast.Name) and node.exc.id == handler.name)
            ):
                return True
            if isinstance(node, ast.Call):
                func = node.func
                if isinstance(func, ast.Attribute) and func.attr in {*LOG_METHODS, "fail", "_exit"}:
                    return True
                if isinstance(func, ast.Name) and func.id == "log":  # the agent's own
                    return True
                if (
                    isinstance(func, ast.Attribute)
                    and func.attr == "write"
                    and node.args
                    and isinstance(node.args[0], ast.Constant)
                    and node.args[0].value == 2  # stderr, in a forked child
                ):
                    return True
    return False


def silent_handlers(source: str, name: str) -> list[str]:
    found: list[str] = []
    tree = ast.parse(source, name)
    for node in ast.walk(tree):
        if isinstance(node, ast.ExceptHandler) and _names(node.type) & BROAD:
            if not _reports(node):
                found.append(f"{name}:{node.lineno}: broad except without a log or re-raise")
        elif isinstance(node, ast.Call):
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if called == "suppress" and any(_names(a) & BROAD for a in node.args):
                found.append(f"{name}:{node.lineno}: suppress() of a broad exception class")
    return found


def test_the_scan_finds_what_it_must() -> None:
    bad = """
import contextlib
try:
    f()
except Exception:
    pass
try:
    f()
except (OSError, BaseException):
    cleanup()
try:
    f()
except:
    x = 1
with contextlib.suppress(Exception):
    f()
try:
    f()
except Exception as exc:
    raise InvalidRequest(str(exc)) from None
"""
    assert sorted(int(line.split(":")[1]) for line in silent_handlers(bad, "m")) == [
        5,
        9,
        13,
        15,
        19,
    ]
    good = """
try:
    f()
except Exception:
    log.exception("f failed for %s", x)
try:
    f()
except BaseException:
    cleanup()
    raise
try:
    f()
except Exception as exc:
    cleanup()
    raise exc
try:
    f()
except OSError:
    pass
"""
    assert silent_handlers(good, "m") == []


def test_no_silent_broad_except_in_src() -> None:
    found: list[str] = []
    for path in sorted(SRC.rglob("*.py")):
        found += silent_handlers(path.read_text(), str(path.relative_to(SRC.parent)))
    assert found == [], "\n".join(found)
