"""OpenAI's V4A patch format: parse, apply and generate, as a pure library (no I/O).

The HTTP layer reads a file, calls :func:`apply_diff` with an operation's ``diff`` and writes
the result back; this package never touches the filesystem, so the same code serves the
hosted ``apply_patch`` tool, the freeform ``*** Begin Patch`` grammar (:func:`parse_patch`)
and tests. Behaviour follows the wire spec §5b; errors are :class:`PatchError` subclasses
whose messages are written for a model to read and correct its next attempt.
"""

from __future__ import annotations

from shellbox.patch.diff import (
    EOF_FUZZ,
    Chunk,
    DiffMode,
    DiffResult,
    Hunk,
    apply_diff,
    apply_diff_detailed,
    make_diff,
    parse_create_diff,
    parse_update_diff,
)
from shellbox.patch.envelope import (
    OperationType,
    PatchOperation,
    format_patch,
    operation_from_dict,
    parse_patch,
)
from shellbox.patch.errors import (
    AnchorNotFoundError,
    ChunkError,
    ContextNotFoundError,
    EmptyHunkError,
    FuzzLimitError,
    InvalidAddFileLineError,
    InvalidOperationError,
    PatchApplyError,
    PatchError,
    PatchParseError,
)

__all__ = [
    "EOF_FUZZ",
    "AnchorNotFoundError",
    "Chunk",
    "ChunkError",
    "ContextNotFoundError",
    "DiffMode",
    "DiffResult",
    "EmptyHunkError",
    "FuzzLimitError",
    "Hunk",
    "InvalidAddFileLineError",
    "InvalidOperationError",
    "OperationType",
    "PatchApplyError",
    "PatchError",
    "PatchOperation",
    "PatchParseError",
    "apply_diff",
    "apply_diff_detailed",
    "format_patch",
    "make_diff",
    "operation_from_dict",
    "parse_create_diff",
    "parse_patch",
    "parse_update_diff",
]
