"""Exceptions raised while parsing or applying V4A patches.

The text of these exceptions is sent back to the model verbatim (the Agents SDK puts
``str(exc)`` in ``apply_patch_call_output.output``), so every message says *where* things went
wrong and *what* was expected. That gives a model enough to correct its next attempt. Each
message starts with the phrase the reference implementation uses (``Invalid Context``,
``Invalid Anchor``, ``Invalid Line``...), so clients that match on those words keep working.
The same facts are also exposed as attributes for programmatic callers.
"""

from __future__ import annotations

__all__ = [
    "AnchorNotFoundError",
    "ChunkError",
    "ContextNotFoundError",
    "EmptyHunkError",
    "FuzzLimitError",
    "InvalidAddFileLineError",
    "InvalidOperationError",
    "PatchApplyError",
    "PatchError",
    "PatchParseError",
]


def _quote(line: str) -> str:
    """Render one line unambiguously (quotes make trailing whitespace visible)."""
    return repr(line)


def _near_miss_sentence(nearest_line: str | None, nearest_line_number: int | None) -> str:
    if nearest_line is None or nearest_line_number is None:
        return "No similar line was found near there."
    return f"Nearest almost-matching line is line {nearest_line_number}: {_quote(nearest_line)}"


class PatchError(ValueError):
    """Base class of every error raised by :mod:`shellbox.patch`.

    It derives from :class:`ValueError` because a bad patch is bad *input*: callers that
    already treat ``ValueError`` as a client error get the right behaviour for free.
    """


class PatchParseError(PatchError):
    """The patch text is malformed: raised before any file content is looked at.

    ``line_number`` is 1-based within the text that was parsed (the envelope for
    :func:`~shellbox.patch.parse_patch`, the diff body for :func:`~shellbox.patch.apply_diff`).
    """

    def __init__(
        self,
        *,
        reason: str,
        line_number: int | None,
        line: str | None,
        expected: str,
        path: str | None = None,
    ) -> None:
        self.reason = reason
        self.line_number = line_number
        self.line = line
        self.expected = expected
        self.path = path
        first = reason if line_number is None else f"{reason} at line {line_number}"
        if line is not None:
            first += f": {_quote(line)}"
        parts = [first]
        if path is not None:
            parts.append(f"(in the section for {path!r})")
        parts.append(f"Expected {expected}.")
        super().__init__("\n".join(parts))


class InvalidAddFileLineError(PatchParseError):
    """A create-file diff contained a line that does not start with ``+``."""


class InvalidOperationError(PatchParseError):
    """A JSON operation is missing a field or has a field of the wrong type (§5b.1)."""


class EmptyHunkError(PatchParseError):
    """A hunk had headers but no body (reference wording: ``Nothing in this section``)."""


class PatchApplyError(PatchError):
    """The diff is well formed but does not fit the file it is applied to.

    ``hunk_index`` is 1-based, counting hunks in the order they appear in the diff.
    """

    def __init__(self, message: str, *, hunk_index: int) -> None:
        self.hunk_index = hunk_index
        super().__init__(message)


class ContextNotFoundError(PatchApplyError):
    """A hunk's context (its space and ``-`` lines) is not in the file after the cursor.

    ``cursor`` is the 0-based index the search started from (the value the reference puts
    after ``Invalid Context``); ``context`` holds the lines that were searched for;
    ``nearest_line``/``nearest_line_number`` describe the closest near miss (1-based), and
    ``expected_line`` the context line it was compared against. ``found_before_cursor`` is set
    when the whole context does exist, but earlier than where the previous hunk ended,
    which almost always means the hunks are out of order; ``found_past_end`` when an
    ``*** End of File`` hunk's context only matches if it includes the empty element after
    the file's final newline.
    """

    def __init__(
        self,
        *,
        hunk_index: int,
        cursor: int,
        context: tuple[str, ...],
        eof: bool,
        nearest_line: str | None,
        nearest_line_number: int | None,
        expected_line: str | None,
        found_before_cursor: bool = False,
        found_past_end: bool = False,
    ) -> None:
        self.cursor = cursor
        self.context = context
        self.eof = eof
        self.nearest_line = nearest_line
        self.nearest_line_number = nearest_line_number
        self.expected_line = expected_line
        self.found_before_cursor = found_before_cursor
        self.found_past_end = found_past_end
        kind = "Invalid EOF Context" if eof else "Invalid Context"
        lines = [f"{kind} {cursor}:", *context]
        count = len(context)
        what = "context line was" if count == 1 else f"{count} context lines were"
        where = f"at or after line {cursor + 1}"
        if eof:
            where = f"at the end of the file (nor {where})"
        lines.append(f"Hunk {hunk_index}: its {what} not found {where}.")
        lines.append("(Context lines are the ' ' and '-' lines; all must match the file.)")
        if found_before_cursor and nearest_line_number is not None:
            lines.append(
                f"They do appear at line {nearest_line_number}, which is before line "
                f"{cursor + 1}, where the search started (after the previous hunk and this "
                "hunk's '@@' anchors). Hunks and anchors must be in file order."
            )
        elif found_past_end and nearest_line_number is not None:
            lines.append(
                f"They do appear at line {nearest_line_number}, but reach past the last line: "
                "the empty line after a final newline is not a line an end-of-file hunk can "
                "match. Drop the trailing blank context line."
            )
        else:
            lines.append(_near_miss_sentence(nearest_line, nearest_line_number))
            if expected_line is not None and nearest_line is not None:
                lines.append(f"It was compared with the context line {_quote(expected_line)}.")
        lines.append("Re-read the file and make the context lines match it exactly.")
        super().__init__("\n".join(lines), hunk_index=hunk_index)


class AnchorNotFoundError(PatchApplyError):
    """A stacked ``@@`` anchor could not be found (reference wording: ``Invalid Anchor``).

    A single ``@@`` anchor that is not found is ignored, as in the reference; only stacked
    anchors are strict.
    """

    def __init__(
        self,
        *,
        hunk_index: int,
        anchor: str,
        cursor: int,
        nearest_line: str | None,
        nearest_line_number: int | None,
    ) -> None:
        self.anchor = anchor
        self.cursor = cursor
        self.nearest_line = nearest_line
        self.nearest_line_number = nearest_line_number
        message = "\n".join(
            [
                f"Invalid Anchor {cursor}:",
                anchor,
                f"Hunk {hunk_index}: the '@@ {anchor}' header was not found at or after "
                f"line {cursor + 1}; stacked '@@' headers must each name an existing line, "
                "in file order.",
                _near_miss_sentence(nearest_line, nearest_line_number),
            ]
        )
        super().__init__(message, hunk_index=hunk_index)


class ChunkError(PatchApplyError):
    """Two changes overlap, or a change points past the end of the file."""


class FuzzLimitError(PatchApplyError):
    """The patch only matched with more fuzz than the caller allowed (opt-in strictness)."""

    def __init__(self, *, fuzz: int, max_fuzz: int, hunk_index: int) -> None:
        self.fuzz = fuzz
        self.max_fuzz = max_fuzz
        message = (
            f"Patch matched only loosely (fuzz {fuzz} > allowed {max_fuzz}); "
            f"hunk {hunk_index} was the first to exceed the limit. "
            "Make the context lines match the file exactly."
        )
        super().__init__(message, hunk_index=hunk_index)
