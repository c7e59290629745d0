"""Parse the ``*** Begin Patch`` ... ``*** End Patch`` envelope into file operations.

The hosted ``apply_patch`` tool sends operations already split up, but the freeform
``apply_patch`` grammar (and humans, and tests) use one text with several file sections
(wire spec §5b.2, "Full patch envelope"). This module turns either form, or its JSON
equivalent, into :class:`PatchOperation` values that the HTTP layer applies one by one. It
checks the syntax of every section up front, with line numbers of the envelope, so a
malformed patch fails before any file is touched.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal, cast

from shellbox.patch.diff import parse_create_diff, parse_update_diff
from shellbox.patch.errors import InvalidOperationError, PatchParseError

__all__ = [
    "ADD_FILE",
    "BEGIN_PATCH",
    "DELETE_FILE",
    "END_PATCH",
    "MOVE_TO",
    "UPDATE_FILE",
    "OperationType",
    "PatchOperation",
    "format_patch",
    "operation_from_dict",
    "parse_patch",
]

OperationType = Literal["create_file", "update_file", "delete_file"]

BEGIN_PATCH = "*** Begin Patch"
END_PATCH = "*** End Patch"
ADD_FILE = "*** Add File:"
DELETE_FILE = "*** Delete File:"
UPDATE_FILE = "*** Update File:"
MOVE_TO = "*** Move to:"

_SECTION_HEADERS = (ADD_FILE, DELETE_FILE, UPDATE_FILE)
_OPERATION_TYPES: tuple[OperationType, ...] = ("create_file", "update_file", "delete_file")
_HEADER_EXPECTED = f"a section header: {ADD_FILE!r}, {DELETE_FILE!r} or {UPDATE_FILE!r}"


@dataclass(frozen=True)
class PatchOperation:
    """One file operation, shaped like ``apply_patch_call.operation`` (§4.5).

    ``diff`` is the V4A body without envelope: only ``+`` lines for ``create_file``, ``@@``
    hunks for ``update_file``, empty for ``delete_file``. ``move_to`` renames the file after
    an update (an Agents SDK extension; the OpenAI schema does not have it).
    """

    type: OperationType
    path: str
    diff: str = ""
    move_to: str | None = None


# --------------------------------------------------------------------------- envelope text


def _header_path(line: str, prefix: str, number: int) -> str:
    path = line[len(prefix) :].strip()
    if not path:
        raise PatchParseError(
            reason="Missing path",
            line_number=number,
            line=line,
            expected=f"a file path after {prefix!r}",
        )
    return path


def _section_end(lines: list[str], i: int, end: int) -> int:
    """Index of the first line at or after ``i`` that ends the current section."""
    while i < end and not lines[i].startswith((*_SECTION_HEADERS, END_PATCH)):
        i += 1
    return i


def _trimmed_bounds(lines: list[str]) -> tuple[int, int]:
    """Skip blank lines around the envelope: a trailing newline is not a format error."""
    lo, hi = 0, len(lines)
    while lo < hi and not lines[lo].strip():
        lo += 1
    while hi > lo and not lines[hi - 1].strip():
        hi -= 1
    return lo, hi


def parse_patch(envelope: str) -> list[PatchOperation]:
    """Parse a full patch into operations, in order.

    Accepts the ``*** Begin Patch`` text form, or (if it starts with ``{`` or ``[``) a JSON
    operation, a JSON list of operations, or an object with ``operation``/``operations``.
    Update and add bodies are syntax-checked here; whether the context fits the file is only
    known when applying. Raises :class:`~shellbox.patch.errors.PatchParseError` (with the
    1-based envelope line number and what was expected) when the text is malformed or holds
    no operation at all.
    """
    if envelope.lstrip().startswith(("{", "[")):
        return _parse_json(envelope)
    lines = [line[:-1] if line.endswith("\r") else line for line in envelope.split("\n")]
    lo, hi = _trimmed_bounds(lines)
    if lo == hi or lines[lo].strip() != BEGIN_PATCH:
        raise PatchParseError(
            reason="Invalid patch",
            line_number=lo + 1 if lo < hi else None,
            line=lines[lo] if lo < hi else None,
            expected=f"{BEGIN_PATCH!r} as the first line",
        )
    if hi - lo < 2 or lines[hi - 1].strip() != END_PATCH:
        raise PatchParseError(
            reason="Invalid patch",
            line_number=hi,
            line=lines[hi - 1],
            expected=f"{END_PATCH!r} as the last line",
        )
    operations: list[PatchOperation] = []
    i, end = lo + 1, hi - 1
    while i < end:
        operation, i = _parse_section(lines, i, end)
        operations.append(operation)
    if not operations:
        raise PatchParseError(
            reason="Empty patch", line_number=hi, line=lines[hi - 1], expected=_HEADER_EXPECTED
        )
    return operations


def _parse_section(lines: list[str], i: int, end: int) -> tuple[PatchOperation, int]:
    """Parse the section whose header is ``lines[i]``; return it and the next index."""
    line, number = lines[i], i + 1
    if line.startswith(DELETE_FILE):
        path = _header_path(line, DELETE_FILE, number)
        if i + 1 < end and not lines[i + 1].startswith((*_SECTION_HEADERS, END_PATCH)):
            raise PatchParseError(
                reason="Unexpected line in delete section",
                line_number=i + 2,
                line=lines[i + 1],
                expected=f"nothing after {line.strip()!r} but the next section header",
                path=path,
            )
        return PatchOperation(type="delete_file", path=path), i + 1
    if line.startswith(ADD_FILE):
        path = _header_path(line, ADD_FILE, number)
        stop = _section_end(lines, i + 1, end)
        if stop == i + 1:
            raise PatchParseError(
                reason="Empty add section",
                line_number=number,
                line=line,
                expected="at least one '+' line with the new file's content",
                path=path,
            )
        diff = "\n".join(lines[i + 1 : stop]) + "\n"
        parse_create_diff(diff, line_offset=i + 1, path=path)
        return PatchOperation(type="create_file", path=path, diff=diff), stop
    if line.startswith(UPDATE_FILE):
        return _parse_update_section(lines, i, end)
    if line.startswith(MOVE_TO):
        expected = f"{MOVE_TO!r} only directly after an {UPDATE_FILE!r} line"
    elif line.startswith(END_PATCH):
        expected = f"{END_PATCH!r} only once, as the last line"
    else:
        expected = _HEADER_EXPECTED
    raise PatchParseError(
        reason="Invalid patch line", line_number=number, line=line, expected=expected
    )


def _parse_update_section(lines: list[str], i: int, end: int) -> tuple[PatchOperation, int]:
    path = _header_path(lines[i], UPDATE_FILE, i + 1)
    body = i + 1
    move_to: str | None = None
    if body < end and lines[body].startswith(MOVE_TO):
        move_to = _header_path(lines[body], MOVE_TO, body + 1)
        body += 1
    stop = _section_end(lines, body, end)
    if stop == body:
        raise PatchParseError(
            reason="Empty update section",
            line_number=body + 1 if body < end else i + 1,
            line=lines[body] if body < end else lines[i],
            expected="at least one hunk ('@@' header, then ' ', '-' or '+' lines)",
            path=path,
        )
    diff = "\n".join(lines[body:stop]) + "\n"
    parse_update_diff(diff, line_offset=body, path=path)
    return PatchOperation(type="update_file", path=path, diff=diff, move_to=move_to), stop


def format_patch(operations: list[PatchOperation]) -> str:
    """Render operations as a ``*** Begin Patch`` envelope (inverse of :func:`parse_patch`).

    A diff without a final newline gets one, since that is how section bodies come back
    out of :func:`parse_patch`; diffs with CRLF endings come back with LF.
    """
    out = [BEGIN_PATCH]
    for op in operations:
        if op.type == "delete_file":
            out.append(f"{DELETE_FILE} {op.path}")
            continue
        out.append(f"{ADD_FILE if op.type == 'create_file' else UPDATE_FILE} {op.path}")
        if op.move_to is not None:
            out.append(f"{MOVE_TO} {op.move_to}")
        body = op.diff[:-1] if op.diff.endswith("\n") else op.diff
        out.append(body)
    out.append(END_PATCH)
    return "\n".join(out) + "\n"


# --------------------------------------------------------------------------- JSON form


def _parse_json(text: str) -> list[PatchOperation]:
    try:
        data: object = json.loads(text)
    except json.JSONDecodeError as exc:
        raise PatchParseError(
            reason=f"Invalid JSON patch ({exc.msg})",
            line_number=exc.lineno,
            line=None,
            expected="a JSON operation object or a list of them",
        ) from exc
    items: object = data
    if isinstance(data, Mapping):
        if "operations" in data:
            items = data["operations"]
        elif "operation" in data:
            items = [data["operation"]]
        else:
            items = [data]
    if not isinstance(items, list) or not items:
        raise InvalidOperationError(
            reason="Invalid JSON patch",
            line_number=None,
            line=None,
            expected="a non-empty list of operations",
        )
    return [operation_from_dict(item, index=k) for k, item in enumerate(items, start=1)]


def _invalid(index: int | None, problem: str) -> InvalidOperationError:
    which = "Invalid operation" if index is None else f"Invalid operation {index}"
    return InvalidOperationError(reason=which, line_number=None, line=None, expected=problem)


def operation_from_dict(data: object, *, index: int | None = None) -> PatchOperation:
    """Validate one JSON operation (the rules the Agents SDK applies, §5b.1).

    ``type`` must be one of the three operation types; ``path`` a non-empty string; ``diff``
    a non-empty string for create and update; ``move_to``, if present, a non-empty string
    and only on updates. The diff's own syntax is also checked. ``index`` (1-based) is only
    used in error messages.
    """
    if not isinstance(data, Mapping):
        raise _invalid(index, "a JSON object with 'type' and 'path'")
    fields = cast("Mapping[str, object]", data)
    kind = fields.get("type")
    if kind not in _OPERATION_TYPES:
        raise _invalid(index, f"'type' to be one of {', '.join(_OPERATION_TYPES)}, not {kind!r}")
    op_type: OperationType = kind
    path = fields.get("path")
    if not isinstance(path, str) or not path.strip():
        raise _invalid(index, "'path' to be a non-empty string")
    diff = fields.get("diff")
    if op_type == "delete_file":
        diff = ""
    elif not isinstance(diff, str) or not diff:
        raise _invalid(index, f"'diff' to be a non-empty string for {op_type}")
    move_to = fields.get("move_to")
    if move_to is not None:
        if not isinstance(move_to, str) or not move_to.strip():
            raise _invalid(index, "'move_to' to be a non-empty string when given")
        if op_type != "update_file":
            raise _invalid(index, "'move_to' only on update_file operations")
    if op_type == "create_file":
        parse_create_diff(diff, path=path)
    elif op_type == "update_file":
        parse_update_diff(diff, path=path)
    return PatchOperation(type=op_type, path=path, diff=diff, move_to=move_to)
