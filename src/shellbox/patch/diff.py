"""Parse and apply one V4A ``diff`` body (wire spec §5b.2-§5b.3), and generate one.

A V4A body is what an ``apply_patch_call`` operation carries: either only ``+`` lines (create)
or ``@@`` hunks (update). Hunks have no line numbers; they are located by searching for their
context, so the search semantics here decide which edit a model actually gets. They follow
the reference applier step by step (anchors, three fuzz passes, ``*** End of File``) so that a
patch that works against OpenAI's tooling works here too, and vice versa.

Performance matters because models send many-hunk patches against big files, and nothing
here rescans the file from the top for every hunk. Most patches match exactly, and those
are applied by a fast path that works on the text itself (``str.find`` on each hunk's joined
context, output assembled from slices), because splitting a big file into a list of lines
is the largest fixed cost. Everything else goes through the general line-list applier: its
searches run forward from the previous hunk's end with ``list.index`` (C speed), "does the
anchor occur before the cursor" is answered from a first-occurrence map built once, and if
a patch keeps missing (e.g. every hunk needs whitespace fuzz) a position index is built so
later misses cost a dictionary lookup instead of a scan.
"""

from __future__ import annotations

import difflib
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from typing import Literal, NamedTuple

from shellbox.patch.errors import (
    AnchorNotFoundError,
    ChunkError,
    ContextNotFoundError,
    EmptyHunkError,
    FuzzLimitError,
    InvalidAddFileLineError,
    PatchParseError,
)

__all__ = [
    "EOF_FUZZ",
    "EOF_MARKER",
    "Chunk",
    "DiffMode",
    "DiffResult",
    "Hunk",
    "apply_diff",
    "apply_diff_detailed",
    "make_diff",
    "parse_create_diff",
    "parse_update_diff",
    "split_diff_lines",
]

DiffMode = Literal["default", "create"]

EOF_MARKER = "*** End of File"
#: Fuzz added when an ``*** End of File`` hunk only matched away from the end of the file.
EOF_FUZZ = 10_000
_RSTRIP_FUZZ = 1
_STRIP_FUZZ = 100
# Prefixes up to this many lines are scanned rather than indexed.
_SHORT_PREFIX = 2048

# Envelope lines that end a diff body early (a body pasted with its envelope still works).
_SECTION_PREFIXES = ("*** End Patch", "*** Update File:", "*** Delete File:", "*** Add File:")
# Lines that end a hunk, and end the whole diff when they appear where a hunk would start.
_STOP_PREFIXES = (*_SECTION_PREFIXES, EOF_MARKER)
_HEADER_EXPECTED = "a hunk header: '@@' alone, or '@@ ' (with a space) then anchor text"
_HUNK_EXPECTED = "a hunk: '@@' header lines followed by ' ', '-' or '+' lines"
_BODY_AFTER_HEADER = "at least one ' ', '-' or '+' line after the '@@' header"
_NEXT_HUNK_EXPECTED = "an '@@' header: every hunk after the first must start with one"
_BODY_EXPECTED = (
    "a hunk line starting with ' ' (unchanged context), '-' (removed), '+' (added), "
    f"an '@@' header that starts the next hunk, or {EOF_MARKER!r}"
)


class Chunk(NamedTuple):
    """One run of ``-``/``+`` lines inside a hunk (a NamedTuple: cheap to build in bulk).

    ``orig_index`` is the position of the first removed line *within the hunk's context*; the
    applier shifts it by the position where the context was found.
    """

    orig_index: int
    del_lines: tuple[str, ...]
    ins_lines: tuple[str, ...]


class Hunk(NamedTuple):
    """One parsed ``@@`` section of an update diff (a NamedTuple: cheap to build in bulk).

    ``context`` is every space and ``-`` line in order (what must be found in the file);
    ``header_count`` counts all ``@@`` lines, bare ones included, because stacking two or more
    makes anchors strict; ``anchors`` keeps only the non-blank anchor texts. ``line_number`` is
    the 1-based diff line the hunk starts on, for error messages.
    """

    anchors: tuple[str, ...]
    header_count: int
    context: tuple[str, ...]
    chunks: tuple[Chunk, ...]
    eof: bool
    line_number: int


@dataclass(frozen=True, slots=True)
class DiffResult:
    """The patched text plus how loosely it matched.

    ``fuzz`` sums 1 per whitespace-insensitive anchor, 1 per hunk matched ignoring trailing
    whitespace, 100 per hunk matched ignoring surrounding whitespace and 10 000 per
    ``*** End of File`` hunk not found at the end. The reference never rejects on fuzz;
    callers may (see ``max_fuzz``).
    """

    text: str
    fuzz: int
    hunks: int


# --------------------------------------------------------------------------- parsing


def split_diff_lines(diff: str) -> list[str]:
    """Split a diff body the way the reference does: on LF or CRLF, dropping one final empty line.

    A trailing ``\\r`` is removed from every line, so a diff typed with CRLF endings parses
    exactly like the LF version; the newline *style* is decided separately.
    """
    lines = diff.split("\n")
    if "\r" in diff:
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    if lines and lines[-1] == "":
        lines.pop()
    return lines


def parse_create_diff(diff: str, *, line_offset: int = 0, path: str | None = None) -> list[str]:
    """Return the file lines of a create diff: every line must start with ``+``.

    An envelope marker (``*** End Patch`` or a section header) ends the diff early, as in the
    reference; ``*** End of File`` does not and is an error here.

    ``line_offset`` is added to reported line numbers and ``path`` is named in errors, so an
    envelope parser can point at its own lines.
    """
    lines = split_diff_lines(diff)
    out: list[str] = []
    for number, line in enumerate(lines, start=line_offset + 1):
        if line.startswith(_SECTION_PREFIXES):
            break
        if not line.startswith("+"):
            raise InvalidAddFileLineError(
                reason="Invalid Add File Line",
                line_number=number,
                line=line,
                expected="every line of a new file to start with '+' (use a lone '+' for a "
                "blank line)",
                path=path,
            )
        out.append(line[1:])
    return out


def parse_update_diff(diff: str, *, line_offset: int = 0, path: str | None = None) -> list[Hunk]:
    """Parse an update diff into hunks (§5b.2), in one pass over its lines.

    Only the first hunk may omit its ``@@`` header (a later headerless hunk is accepted here
    and rejected by the applier unless the cursor is still at 0, as in the reference). A line
    that is exactly empty is context with empty content. ``*** End of File`` closes a hunk;
    an envelope marker (or ``*** End of File`` where a hunk would start) ends the diff. An
    empty diff yields no hunks, so applying it is a no-op. ``line_offset`` and ``path`` only
    change error messages (see :func:`parse_create_diff`).
    """
    lines = split_diff_lines(diff)
    hunks: list[Hunk] = []
    anchors: list[str] = []
    headers = 0
    start = 0  # index of the current hunk's first line
    context: list[str] = []
    chunks: list[Chunk] = []
    dels: list[str] = []
    ins: list[str] = []
    chunk_start = -1  # >= 0 while a run of -/+ lines is open
    # The per-line branches below only append to lists; everything else happens on the
    # rare header and marker lines. (This loop is most of the parse time for big diffs.)
    for index, line in enumerate(lines):
        tag = line[:1]
        if tag == " " or not line:
            if chunk_start >= 0:
                chunks.append(Chunk(chunk_start, tuple(dels), tuple(ins)))
                dels, ins, chunk_start = [], [], -1
            context.append(line[1:])
        elif tag == "-":
            if chunk_start < 0:
                chunk_start = len(context)
            dels.append(line[1:])
            context.append(line[1:])
        elif tag == "+":
            if chunk_start < 0:
                chunk_start = len(context)
            ins.append(line[1:])
        else:
            in_body = bool(context) or chunk_start >= 0
            is_eof = line.startswith(EOF_MARKER)
            if line == "@@" or line.startswith("@@ ") or in_body or (headers and is_eof):
                if in_body or (headers and is_eof):
                    if chunk_start >= 0:
                        chunks.append(Chunk(chunk_start, tuple(dels), tuple(ins)))
                    number = line_offset + start + 1
                    hunks.append(
                        Hunk(tuple(anchors), headers, tuple(context), tuple(chunks), is_eof, number)
                    )
                    anchors, headers, context, chunks = [], 0, [], []
                    dels, ins, chunk_start, start = [], [], -1, index + 1
                if line == "@@" or line.startswith("@@ "):
                    if not headers:
                        start = index
                    headers += 1
                    if line[3:].strip():
                        anchors.append(line[3:])
                    continue
                if is_eof:
                    continue
            _reject_line(lines, index, line_offset, path, headers=headers, hunks=len(hunks))
            break
    else:
        if context or chunk_start >= 0:
            if chunk_start >= 0:
                chunks.append(Chunk(chunk_start, tuple(dels), tuple(ins)))
            number = line_offset + start + 1
            hunks.append(
                Hunk(tuple(anchors), headers, tuple(context), tuple(chunks), False, number)
            )
        elif headers:
            _reject_line(lines, len(lines), line_offset, path, headers=headers, hunks=len(hunks))
    return hunks


def _reject_line(
    lines: list[str], index: int, line_offset: int, path: str | None, *, headers: int, hunks: int
) -> None:
    """Handle a line that is not a hunk line, where no hunk body is open.

    Returns normally only for an envelope marker (or ``*** End of File``) where a hunk
    would start, which ends the diff; raises the right parse error otherwise.
    """
    line = lines[index] if index < len(lines) else None
    reason, kind, expected = "Invalid Line", PatchParseError, _BODY_EXPECTED
    if line is None or ((line == "***" or line.startswith(_STOP_PREFIXES)) and headers):
        reason, kind, expected = "Nothing in this section", EmptyHunkError, _BODY_AFTER_HEADER
    elif line.startswith("@"):
        expected = _HEADER_EXPECTED
    elif line == "***" and hunks:
        expected = _NEXT_HUNK_EXPECTED
    elif line == "***":
        reason, kind, expected = "Nothing in this section", EmptyHunkError, _HUNK_EXPECTED
    elif line.startswith(_STOP_PREFIXES):
        return
    number = line_offset + index + 1 if line is not None else None
    raise kind(reason=reason, line_number=number, line=line, expected=expected, path=path)


# --------------------------------------------------------------------------- searching


class _Haystack:
    """The file's lines under one normalization, with the searches the applier needs.

    Searches scan forward with ``list.index`` (C speed), which is cheapest while hunks are
    found near the cursor. Misses are what can make patching quadratic, so after the first
    one a last-occurrence map is built (one C-speed pass) that rejects most later misses
    without scanning; and if scans keep missing anyway, about ``rebuild_factor`` whole-file
    scans in, a line -> positions index takes over all searches.
    """

    __slots__ = ("_first", "_last", "_positions", "_wasted", "lines", "rebuild_factor")

    def __init__(self, lines: list[str], rebuild_factor: int = 4) -> None:
        self.lines = lines
        self.rebuild_factor = rebuild_factor
        self._positions: dict[str, list[int]] | None = None
        self._first: dict[str, int] | None = None
        self._last: dict[str, int] | None = None
        self._wasted = 0

    def _missed(self, scanned: int) -> None:
        if self._last is None:
            self._last = dict(zip(self.lines, range(len(self.lines)), strict=True))
        self._wasted += max(scanned, 1)
        if self._positions is None and self._wasted > self.rebuild_factor * len(self.lines):
            positions: dict[str, list[int]] = {}
            for index, line in enumerate(self.lines):
                positions.setdefault(line, []).append(index)
            self._positions = positions

    def occurs_before(self, line: str, stop: int) -> bool:
        """Whether ``line`` is one of ``lines[:stop]``.

        Short prefixes are scanned; otherwise a first-occurrence map is built once (at C
        speed), so asking this for every hunk of a long file stays linear overall.
        """
        if stop <= 0:
            return False
        if self._positions is not None:
            found = self._positions.get(line)
            return found is not None and found[0] < stop
        if self._last is not None and line not in self._last:
            return False  # not in the file at all
        if self._first is None:
            if stop <= _SHORT_PREFIX:
                try:
                    self.lines.index(line, 0, stop)
                except ValueError:
                    return False
                return True
            lines = self.lines
            self._first = dict(zip(reversed(lines), range(len(lines) - 1, -1, -1), strict=True))
        first = self._first.get(line)
        return first is not None and first < stop

    def find_line(self, line: str, start: int, end: int | None = None) -> int:
        """Index of the first ``line`` in ``lines[start:end]``, or -1."""
        stop = len(self.lines) if end is None else end
        if self._positions is not None:
            found = self._positions.get(line)
            if found is None:
                return -1
            k = bisect_left(found, start)
            return found[k] if k < len(found) and found[k] < stop else -1
        if self._last is not None and self._last.get(line, -1) < start:
            return -1
        try:
            return self.lines.index(line, start, stop)
        except ValueError:
            self._missed(stop - start)
            return -1

    def find(self, needle: list[str], start: int, end: int | None = None) -> int:
        """Index of the first block equal to ``needle`` inside ``lines[start:end]``, or -1.

        An empty block matches at ``start``. Candidates are generated from the longest needle
        line (likely the rarest), so a common line such as ``}`` does not cause a check per
        occurrence.
        """
        lines = self.lines
        stop = len(lines) if end is None else end
        size = len(needle)
        if size == 0:
            return start if start <= stop else -1
        if size == 1:
            return self.find_line(needle[0], start, stop)
        if self._positions is not None:
            return self._find_indexed(needle, start, stop)
        last = self._last
        if last is not None:
            for offset, line in enumerate(needle):
                if last.get(line, -1) < start + offset:
                    return -1
        lengths = list(map(len, needle))
        pivot = lengths.index(max(lengths))
        key = needle[pivot]
        probe_stop = stop - size + pivot + 1
        probe = start + pivot
        while True:
            try:
                probe = lines.index(key, probe, probe_stop)
            except ValueError:
                self._missed(probe_stop - probe)
                return -1
            first = probe - pivot
            if lines[first : first + size] == needle:
                return first
            probe += 1

    def _find_indexed(self, needle: list[str], start: int, stop: int) -> int:
        positions = self._positions
        assert positions is not None
        best: list[int] = []
        pivot = -1
        for k, line in enumerate(needle):
            found = positions.get(line)
            if found is None:
                return -1
            if pivot < 0 or len(found) < len(best):
                best, pivot = found, k
        lines = self.lines
        size = len(needle)
        last = stop - size
        for k in range(bisect_left(best, start + pivot), len(best)):
            first = best[k] - pivot
            if first > last:
                return -1
            if lines[first : first + size] == needle:
                return first
        return -1


class _File:
    """The file being patched plus lazily built whitespace-normalized views of it."""

    __slots__ = ("_rstripped", "_stripped", "exact", "lines")

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines
        self.exact = _Haystack(lines)
        self._rstripped: _Haystack | None = None
        self._stripped: _Haystack | None = None

    @property
    def rstripped(self) -> _Haystack:
        if self._rstripped is None:
            self._rstripped = _Haystack(list(map(str.rstrip, self.lines)))
        return self._rstripped

    @property
    def stripped(self) -> _Haystack:
        if self._stripped is None:
            self._stripped = _Haystack(list(map(str.strip, self.lines)))
        return self._stripped

    @property
    def real_length(self) -> int:
        """Number of lines, not counting the ``""`` left by a final newline."""
        lines = self.lines
        return len(lines) - 1 if lines and lines[-1] == "" else len(lines)

    def locate(self, context: list[str], start: int, end: int | None = None) -> tuple[int, int]:
        """Find ``context`` in ``lines[start:end]``: exact, then rstrip, then strip (§5b.3 4).

        Each pass scans the whole range before the next, looser one is tried. Returns
        ``(index, fuzz)``, index -1 when no pass matched.
        """
        found = self.exact.find(context, start, end)
        if found >= 0:
            return found, 0
        found = self.rstripped.find([line.rstrip() for line in context], start, end)
        if found >= 0:
            return found, _RSTRIP_FUZZ
        found = self.stripped.find([line.strip() for line in context], start, end)
        if found >= 0:
            return found, _STRIP_FUZZ
        return -1, 0


# --------------------------------------------------------------------------- near misses


# How many lines around the cursor are compared character by character for a hint.
_HINT_WINDOW_BEFORE = 1_000
_HINT_WINDOW_AFTER = 3_000


def _most_similar(lines: list[str], targets: list[str], cursor: int) -> int | None:
    """Index of the file line most similar to any of ``targets`` (error path only).

    Character-level similarity is slow in Python, so only a window of lines around the
    cursor is compared; that is also where a model's intended line usually is.
    """
    wanted = [t.strip() for t in targets if t.strip()]
    low = max(0, cursor - _HINT_WINDOW_BEFORE)
    first_at: dict[str, int] = {}
    for index in range(low, min(len(lines), cursor + _HINT_WINDOW_AFTER)):
        key = lines[index].strip()
        if key and (key not in first_at or first_at[key] < cursor <= index):
            first_at[key] = index
    best_key: str | None = None
    best_ratio = 0.5  # below this a "hint" is noise
    matcher = difflib.SequenceMatcher(autojunk=False)
    for target in dict.fromkeys(sorted(wanted, key=len, reverse=True)[:3]):
        matcher.set_seq2(target)
        for key in first_at:
            matcher.set_seq1(key)
            if (
                matcher.real_quick_ratio() > best_ratio
                and matcher.quick_ratio() > best_ratio
                and matcher.ratio() > best_ratio
            ):
                best_ratio, best_key = matcher.ratio(), key
    return None if best_key is None else first_at[best_key]


def _near_miss(lines: list[str], context: tuple[str, ...], cursor: int) -> tuple[int, int, bool]:
    """Describe the closest place the context almost matches (error path only).

    Every file line equal (ignoring surrounding whitespace) to a context line votes for an
    alignment of the whole context. The best-voted alignment is where the model most likely
    meant; the first context line that differs there is the one to fix. Returns
    ``(file index, context index, whole context matches there)``; file index -1 if there is
    no hint. A whole match means the block is before the cursor or, for an end-of-file hunk,
    runs into the empty element after the final newline.
    """
    stripped_ctx = [line.strip() for line in context]
    wanted = {line for line in stripped_ctx if line}
    positions: dict[str, list[int]] = {}
    stripped = [line.strip() for line in lines]
    for index, line in enumerate(stripped):
        if line in wanted:
            positions.setdefault(line, []).append(index)
    votes: Counter[int] = Counter()
    for offset, line in enumerate(stripped_ctx):
        for index in positions.get(line, ())[:1000]:
            votes[index - offset] += 1
    if votes:
        best = min(votes, key=lambda i: (-votes[i], i < cursor, abs(i - cursor)))
        in_range: list[int] = []
        for offset, line in enumerate(stripped_ctx):
            index = best + offset
            if 0 <= index < len(lines):
                in_range.append(offset)
                if stripped[index] != line:
                    return index, offset, False
        if len(in_range) == len(context):
            return best, 0, True
        if in_range:
            return best + in_range[0], in_range[0], False
    similar = _most_similar(lines, list(context), cursor)
    if similar is None:
        return -1, 0, False
    target = lines[similar].strip()
    offset = max(
        range(len(context)),
        key=lambda k: difflib.SequenceMatcher(None, context[k].strip(), target).ratio(),
    )
    return similar, offset, False


def _context_error(file: _File, hunk: Hunk, number: int, cursor: int) -> ContextNotFoundError:
    index, offset, whole = _near_miss(file.lines, hunk.context, cursor)
    return ContextNotFoundError(
        hunk_index=number,
        cursor=cursor,
        context=hunk.context,
        eof=hunk.eof,
        nearest_line=file.lines[index] if index >= 0 else None,
        nearest_line_number=index + 1 if index >= 0 else None,
        expected_line=hunk.context[offset] if index >= 0 and hunk.context else None,
        found_before_cursor=whole and index < cursor,
        found_past_end=whole and index >= cursor,
    )


# --------------------------------------------------------------------------- applying


def _seek_anchors(file: _File, hunk: Hunk, cursor: int, number: int) -> tuple[int, int]:
    """Move the cursor past the hunk's ``@@`` anchors (§5b.3 step 3.2). Returns (cursor, fuzz).

    Only the first anchor may be satisfied by a line *before* the cursor (the cursor then
    stays put). A missing anchor is an error only when two or more ``@@`` lines are stacked.
    """
    fuzz = 0
    for position, anchor in enumerate(hunk.anchors):
        first = position == 0
        if first and file.exact.occurs_before(anchor, cursor):
            continue
        found = file.exact.find_line(anchor, cursor)
        if found >= 0:
            cursor = found + 1
            continue
        loose = anchor.strip()
        if first and file.stripped.occurs_before(loose, cursor):
            continue
        found = file.stripped.find_line(loose, cursor)
        if found >= 0:
            cursor = found + 1
            fuzz += 1
            continue
        if hunk.header_count > 1:
            similar = _most_similar(file.lines, [anchor], cursor)
            raise AnchorNotFoundError(
                hunk_index=number,
                anchor=anchor,
                cursor=cursor,
                nearest_line=file.lines[similar] if similar is not None else None,
                nearest_line_number=similar + 1 if similar is not None else None,
            )
    return cursor, fuzz


def _place_hunk(file: _File, hunk: Hunk, cursor: int, number: int) -> tuple[int, int]:
    """Where the hunk's context starts: anchors, then context search. Returns (index, fuzz).

    Fast path for the usual hunk with one anchor that lies ahead of the cursor: whether the
    anchor *also* occurs before the cursor (which would keep the cursor in place) only
    matters if the context occurs between the cursor and the anchor. If the first exact
    context match is after the anchor, both readings give that match, and the question
    need not be asked.
    """
    if len(hunk.anchors) == 1 and not hunk.eof:
        ahead = file.exact.find_line(hunk.anchors[0], cursor)
        if ahead >= 0:
            early = file.exact.find(list(hunk.context), cursor)
            if early > ahead:
                return early, 0
    cursor, anchor_fuzz = _seek_anchors(file, hunk, cursor, number)
    found, fuzz = _find_hunk(file, hunk, cursor, number)
    return found, anchor_fuzz + fuzz


def _find_hunk(file: _File, hunk: Hunk, cursor: int, number: int) -> tuple[int, int]:
    """Position of the hunk's context (§5b.3 step 3.4). Returns (index, fuzz)."""
    context = list(hunk.context)
    if hunk.eof:
        # End-of-file hunks only match real lines: the "" left by a final newline is not
        # one. First the very end, then anywhere after the cursor (heavily fuzzed).
        real = file.real_length
        found, fuzz = file.locate(context, max(real - len(context), 0), real)
        if found >= 0:
            return found, fuzz
        found, fuzz = file.locate(context, cursor, real)
        if found >= 0:
            return found, fuzz + EOF_FUZZ
    else:
        found, fuzz = file.locate(context, cursor)
        if found >= 0:
            return found, fuzz
    raise _context_error(file, hunk, number, cursor)


def _splice(lines: list[str], edits: list[tuple[int, Chunk, int]]) -> list[str]:
    """Replace each chunk's removed lines by its added lines (§5b.3 step 4)."""
    out: list[str] = []
    done = 0
    total = len(lines)
    for start, chunk, number in edits:
        if start < done:
            message = (
                f"overlapping chunk: hunk {number} changes line {start + 1}, which an "
                f"earlier change already covered (up to line {done}). Merge the two hunks "
                "or put hunks in file order."
            )
            raise ChunkError(message, hunk_index=number)
        if start > total:
            message = (
                f"chunk out of range: hunk {number} changes line {start + 1}, "
                f"but the file has only {total} lines."
            )
            raise ChunkError(message, hunk_index=number)
        out += lines[done:start]
        out += chunk.ins_lines
        done = start + len(chunk.del_lines)
    out += lines[done:]
    return out


def _newline_style(text: str, diff: str, mode: DiffMode) -> str:
    """CRLF if the file (or, for create/no-newline files, the diff) uses CRLF (§5b.3 step 1)."""
    source = text if mode != "create" and "\n" in text else diff
    # "\r" is found with memchr; looking for "\r\n" in a big LF file is 50x slower.
    return "\r\n" if "\r" in source and "\r\n" in source else "\n"


def _split_file(text: str) -> list[str]:
    """The file's lines with CRLF normalized to LF (§5b.3 step 2); a final newline leaves ""."""
    if "\r" not in text:
        return text.split("\n")
    lines = text.split("\r\n")  # no 5 ms replace() for the common all-CRLF file
    if len(lines) - 1 == text.count("\n"):
        return lines
    return text.replace("\r\n", "\n").split("\n")


def _apply_lines(text: str, hunks: list[Hunk], newline: str, max_fuzz: int | None) -> DiffResult:
    """The general applier over a list of lines: every rule of §5b.3, with fuzz."""
    file = _File(_split_file(text))
    cursor = 0
    fuzz = 0
    edits: list[tuple[int, Chunk, int]] = []
    for number, hunk in enumerate(hunks, start=1):
        if hunk.header_count == 0 and cursor != 0:
            raise PatchParseError(
                reason="Invalid Line",
                line_number=hunk.line_number,
                line=None,
                expected=f"an '@@' header before hunk {number}: only the first hunk may omit it",
            )
        found, hunk_fuzz = _place_hunk(file, hunk, cursor, number)
        fuzz += hunk_fuzz
        if max_fuzz is not None and fuzz > max_fuzz:
            raise FuzzLimitError(fuzz=fuzz, max_fuzz=max_fuzz, hunk_index=number)
        cursor = found + len(hunk.context)
        edits.extend((found + chunk.orig_index, chunk, number) for chunk in hunk.chunks)
    return DiffResult(text=newline.join(_splice(file.lines, edits)), fuzz=fuzz, hunks=len(hunks))


def _uniform_separator(text: str) -> str | None:
    """``"\n"`` or ``"\r\n"`` if every line break in ``text`` is that one, else None."""
    if "\n" not in text:
        return None  # the newline style would come from the diff
    if "\r" not in text:
        return "\n"
    return "\r\n" if text.count("\n") == text.count("\r\n") else None


def _find_block(text: str, core: str, sep: str, start: int) -> int:
    """Offset of the first whole-line occurrence of ``core`` at or after line offset ``start``.

    ``core`` is lines joined by ``sep``; a match must begin at a line start and end at a
    line end. Returns -1 if there is none.
    """
    size = len(core)
    end = len(text)
    if text.startswith(core, start) and (start + size == end or text.startswith(sep, start + size)):
        return start
    found = text.find(sep + core + sep, start)
    if found >= 0:
        return found + len(sep)
    tail = end - size
    if tail - len(sep) >= start and text.endswith(core) and text.startswith(sep, tail - len(sep)):
        return tail
    return -1


def _occurs_before(text: str, core: str, sep: str, stop: int) -> bool:
    """Whether a whole line equal to ``core`` starts before offset ``stop``."""
    width = len(sep)
    if text.startswith(core) and (len(core) == len(text) or text.startswith(sep, len(core))):
        return stop > 0
    needle = sep + core + sep
    if text.find(needle, 0, stop - width - 1 + len(needle)) >= 0:
        return True
    tail = len(text) - len(core)
    return 0 < tail < stop and text.endswith(core) and text.startswith(sep, tail - width)


def _line_between(text: str, core: str, sep: str, low: int, high: int) -> bool:
    """Whether a whole line equal to ``core`` starts in ``[low, high)`` (line offsets).

    Searches backwards from ``high``: an anchor usually sits just above its context, so
    this stops after a few lines instead of scanning forward from the cursor.
    """
    if high <= low:
        return False
    width = len(sep)
    if low == 0 and text.startswith(core) and text.startswith(sep, len(core)):
        return True
    needle = sep + core + sep
    return text.rfind(needle, max(low - width, 0), high - width - 1 + len(needle)) >= 0


def _eof_block(text: str, core: str, sep: str, lines: int) -> int:
    """Offset where the last ``lines`` real lines start if they equal ``core``, else -1.

    The "" element left by a final newline is not a real line.
    """
    width = len(sep)
    real_end = len(text) - width if text.endswith(sep) else len(text)
    if lines == 0:
        return real_end + width
    start = real_end - len(core)
    if start < 0 or text[start:real_end] != core:
        return -1
    return start if start == 0 or text.startswith(sep, start - width) else -1


class _Budget:
    """Caps how much text the fast path rescans, so it stays linear; over budget -> give up."""

    __slots__ = ("left",)

    def __init__(self, chars: int) -> None:
        self.left = chars

    def spend(self, chars: int) -> bool:
        self.left -= chars
        return self.left >= 0


def _joined_position(text: str, hunk: Hunk, sep: str, cursor: int, budget: _Budget) -> int:
    """Offset of the hunk's context under exact matching, or -1 to defer to the line path."""
    context = sep.join(hunk.context)
    if hunk.eof:
        # Anchors only matter if the end does not match; they could add fuzz or fail.
        return -1 if hunk.anchors else _eof_block(text, context, sep, len(hunk.context))
    found = _find_block(text, context, sep, cursor) if hunk.context else cursor
    if found < 0 or not hunk.anchors:
        return found
    anchor = hunk.anchors[0]
    if _line_between(text, anchor, sep, cursor, found):
        return found  # same answer whether or not the anchor also occurs before the cursor
    if not budget.spend(cursor):  # the only scan here that is not amortized by the cursor
        return -1
    if _occurs_before(text, anchor, sep, cursor):
        return found  # the anchor counts as found before the cursor, which stays put
    anchor_at = _find_block(text, anchor, sep, found)  # none in [cursor, found), see above
    if anchor_at < 0:
        return -1  # whitespace-insensitive anchor search: the line path's job
    after = anchor_at + len(anchor) + len(sep)
    return _find_block(text, context, sep, after) if hunk.context else after


def _apply_joined(text: str, hunks: list[Hunk], sep: str) -> str | None:
    """Exact-match fast path working on the text itself, without splitting it into lines.

    Splitting a big file into a list is the largest fixed cost of the general path, and
    most patches match exactly. Here each hunk is found with ``str.find`` on its joined
    context, positions are character offsets of line starts, and the result is assembled
    from slices. Anything beyond exact matching (fuzz, stacked anchors, an end-of-file hunk
    not at the end, overlaps, errors) returns None, and the caller uses
    :func:`_apply_lines`, which gives identical results on everything this path accepts.
    """
    width = len(sep)
    past_end = len(text) + width  # offset of the line after the last one
    budget = _Budget(4 * len(text))
    runs: list[str] = []  # runs of whole lines, to be joined with sep
    copied = 0  # offset of the first line not yet copied or deleted
    cursor = 0
    for hunk in hunks:
        if len(hunk.anchors) > 1 or (hunk.header_count == 0 and cursor != 0):
            return None
        found = _joined_position(text, hunk, sep, cursor, budget)
        if found < 0:
            return None
        context = hunk.context
        position, consumed = found, 0
        for chunk in hunk.chunks:
            position += sum(map(len, context[consumed : chunk.orig_index]))
            position += width * (chunk.orig_index - consumed)
            consumed = chunk.orig_index
            if position < copied:
                return None
            if position > copied:
                runs.append(text[copied : position - width])
            if chunk.ins_lines:
                runs.append(sep.join(chunk.ins_lines))
            removed = len(chunk.del_lines)
            copied = position + sum(map(len, chunk.del_lines)) + width * removed
            position, consumed = copied, consumed + removed
        cursor = found + sum(map(len, context)) + width * len(context)
    if copied < past_end:
        runs.append(text[copied:])
    return sep.join(runs)


def apply_diff_detailed(
    text: str, diff: str, mode: DiffMode = "default", *, max_fuzz: int | None = None
) -> DiffResult:
    """Like :func:`apply_diff`, but also report the fuzz score and hunk count."""
    if mode not in ("default", "create"):
        message = f"mode must be 'default' or 'create', not {mode!r}"
        raise ValueError(message)
    if max_fuzz is not None and max_fuzz < 0:
        message = f"max_fuzz must be >= 0, not {max_fuzz}"
        raise ValueError(message)
    newline = _newline_style(text, diff, mode)
    if mode == "create":
        created = parse_create_diff(diff)
        return DiffResult(text=newline.join(created), fuzz=0, hunks=1 if created else 0)
    hunks = parse_update_diff(diff)
    sep = _uniform_separator(text)
    if sep is not None:
        joined = _apply_joined(text, hunks, sep)
        if joined is not None:
            return DiffResult(text=joined, fuzz=0, hunks=len(hunks))
    return _apply_lines(text, hunks, newline, max_fuzz)


def apply_diff(
    text: str, diff: str, mode: DiffMode = "default", *, max_fuzz: int | None = None
) -> str:
    """Apply a V4A ``diff`` body to ``text`` and return the new text.

    ``mode="create"`` builds a new file from a diff of only ``+`` lines; ``text`` is ignored,
    as in the reference. ``mode="default"`` applies ``@@`` hunks. CRLF files stay CRLF, a
    missing final newline stays missing. ``max_fuzz`` is an opt-in strictness knob the
    reference does not have: pass e.g. ``EOF_FUZZ - 1`` to refuse end-of-file hunks that only
    matched elsewhere. Raises a :class:`~shellbox.patch.errors.PatchError` subclass.
    """
    return apply_diff_detailed(text, diff, mode, max_fuzz=max_fuzz).text


# --------------------------------------------------------------------------- generating


def _line_style(old: str, new: str) -> str:
    if "\n" in old:
        return "\r\n" if "\r\n" in old else "\n"
    return "\r\n" if "\r\n" in new else "\n"


def _shortest_unique_start(haystack: _Haystack, cursor: int, lo: int, hi: int) -> int:
    """Smallest extension of ``lines[lo:hi]`` backwards whose first match from cursor is itself.

    Extending a block that is found first at its own position keeps it first, so the
    answer is monotonic and can be binary searched. ``lo == cursor`` always works.
    """
    lines = haystack.lines
    if haystack.find(lines[lo:hi], cursor) == lo:
        return lo
    good, bad = cursor, lo
    while bad - good > 1:
        middle = (good + bad) // 2
        if haystack.find(lines[middle:hi], cursor) == middle:
            good = middle
        else:
            bad = middle
    return good


# Gaps with no unique lines are diffed with difflib only up to this many line pairs;
# bigger ones are emitted as one replacement (still correct, just not minimal).
_SMALL_GAP = 250_000


def _unique_anchors(
    a: list[str], b: list[str], span: tuple[int, int, int, int]
) -> list[tuple[int, int]]:
    """Patience-diff anchors: lines unique in both ranges, longest order-preserving subset."""
    alo, ahi, blo, bhi = span
    count_a = Counter(a[alo:ahi])
    count_b = Counter(b[blo:bhi])
    where_b = {b[j]: j for j in range(blo, bhi) if count_b[b[j]] == 1 and count_a[b[j]] == 1}
    seq = [(i, where_b[a[i]]) for i in range(alo, ahi) if a[i] in where_b]
    tails: list[int] = []  # smallest b index ending an increasing run of each length
    tail_at: list[int] = []  # position in seq of that element
    previous: list[int] = []
    for k, (_, j) in enumerate(seq):
        length = bisect_left(tails, j)
        if length == len(tails):
            tails.append(j)
            tail_at.append(k)
        else:
            tails[length] = j
            tail_at[length] = k
        previous.append(tail_at[length - 1] if length else -1)
    out: list[tuple[int, int]] = []
    k = tail_at[-1] if tail_at else -1
    while k >= 0:
        out.append(seq[k])
        k = previous[k]
    out.reverse()
    return out


def _matching_pairs(a: list[str], b: list[str]) -> list[tuple[int, int]]:
    """Pairs (i, j) with ``a[i] == b[j]``, increasing in both, forming a good line diff.

    Patience diff: match common prefixes and suffixes, then lines that are unique on both
    sides, and recurse into the gaps; gaps without unique lines fall back to difflib. This
    is near-linear for big files, where difflib alone is quadratic.
    """
    pairs: list[tuple[int, int]] = []
    stack = [(0, len(a), 0, len(b))]
    while stack:
        alo, ahi, blo, bhi = stack.pop()
        while alo < ahi and blo < bhi and a[alo] == b[blo]:
            pairs.append((alo, blo))
            alo, blo = alo + 1, blo + 1
        while alo < ahi and blo < bhi and a[ahi - 1] == b[bhi - 1]:
            ahi, bhi = ahi - 1, bhi - 1
            pairs.append((ahi, bhi))
        if alo == ahi or blo == bhi:
            continue
        anchors = _unique_anchors(a, b, (alo, ahi, blo, bhi))
        if anchors:
            for i, j in anchors:
                pairs.append((i, j))
                stack.append((alo, i, blo, j))
                alo, blo = i + 1, j + 1
            stack.append((alo, ahi, blo, bhi))
        elif (ahi - alo) * (bhi - blo) <= _SMALL_GAP:
            matcher = difflib.SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=False)
            for block in matcher.get_matching_blocks():
                pairs.extend((alo + block.a + k, blo + block.b + k) for k in range(block.size))
    pairs.sort()
    return pairs


def _change_groups(
    a: list[str], b: list[str], context: int
) -> list[list[tuple[int, int, int, int]]]:
    """Changed blocks ``(i1, i2, j1, j2)``, grouped so that each group becomes one hunk.

    Blocks separated by at most ``2 * context`` unchanged lines share a hunk, as in
    unified diffs, so no two hunks' context overlaps.
    """
    groups: list[list[tuple[int, int, int, int]]] = []
    i0 = j0 = 0
    for i, j in [*_matching_pairs(a, b), (len(a), len(b))]:
        if i > i0 or j > j0:
            block = (i0, i, j0, j)
            if groups and i0 - groups[-1][-1][1] <= 2 * context:
                groups[-1].append(block)
            else:
                groups.append([block])
        i0, j0 = i + 1, j + 1
    return groups


def make_diff(old: str, new: str, context: int = 3) -> str:
    """Generate a V4A update diff that turns ``old`` into ``new`` under :func:`apply_diff`.

    Hunks get ``context`` lines on each side, like unified diffs, and each starts with a bare
    ``@@``. Because V4A hunks are found by searching rather than by line number, a hunk whose
    context also occurs earlier is given more leading context (up to the end of the previous
    hunk) until the search can only land in the right place. Returns ``""`` when the texts
    are equal.

    Raises :class:`ValueError` for what V4A cannot express: ``new`` with line endings that the
    applier would not produce (it keeps ``old``'s style), or a changed or context line that
    ends with a stray carriage return.
    """
    if context < 0:
        message = f"context must be >= 0, not {context}"
        raise ValueError(message)
    newline = _line_style(old, new)
    before = old.replace("\r\n", "\n").split("\n")
    after = new.replace("\r\n", "\n").split("\n")
    if newline.join(after) != new:
        style = "CRLF" if newline == "\r\n" else "LF"
        message = (
            "make_diff cannot express the line endings of `new`: applying a diff writes "
            f"every line with {style} endings here"
        )
        raise ValueError(message)
    if before == after:
        return ""
    haystack = _Haystack(before)
    out: list[str] = []
    cursor = 0
    for group in _change_groups(before, after, context):
        lo = max(group[0][0] - context, cursor)
        hi = min(group[-1][1] + context, len(before))
        start = _shortest_unique_start(haystack, cursor, lo, hi)
        out.append("@@")
        done = start
        for i1, i2, j1, j2 in group:
            out.extend(" " + line for line in before[done:i1])
            out.extend("-" + line for line in before[i1:i2])
            out.extend("+" + line for line in after[j1:j2])
            done = i2
        out.extend(" " + line for line in before[done:hi])
        cursor = hi
    if any(line.endswith("\r") for line in out):
        message = "make_diff cannot express a line that ends with a carriage return"
        raise ValueError(message)
    diff_newline = "\n" if "\n" in old else newline
    return diff_newline.join(out) + diff_newline
