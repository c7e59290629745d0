"""Parse and apply one V4A ``diff`` body (wire spec §5b.2-§5b.3), and generate one.

A V4A body is what an ``apply_patch_call`` operation carries: either only ``+`` lines (create)
or ``@@`` hunks (update). Hunks have no line numbers; they are located by searching for their
context, so the search semantics here decide which edit a model actually gets. They follow
the reference applier step by step (anchors, three fuzz passes, ``*** End of File``) so that a
patch that works against OpenAI's tooling works here too, and vice versa.

Performance matters because models send many-hunk patches against big files. The applier
never rescans the file from the top: searches run forward from the previous hunk's end with
``list.index`` (C speed), "seen before the cursor" questions use an incrementally grown set,
and if a patch keeps missing (e.g. every hunk needs whitespace fuzz) a position index is built
once so later misses cost a dictionary lookup instead of a scan.
"""

from __future__ import annotations

import difflib
from bisect import bisect_left
from collections import Counter
from dataclasses import dataclass
from typing import Literal

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

# Envelope lines that end a diff body early (a body pasted with its envelope still works).
_SECTION_PREFIXES = ("*** End Patch", "*** Update File:", "*** Delete File:", "*** Add File:")
# Lines that end a hunk, and end the whole diff when they appear where a hunk would start.
_STOP_PREFIXES = (*_SECTION_PREFIXES, EOF_MARKER)
_BODY_EXPECTED = (
    "a hunk line starting with ' ' (unchanged context), '-' (removed), '+' (added), "
    f"an '@@' header that starts the next hunk, or {EOF_MARKER!r}"
)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One run of ``-``/``+`` lines inside a hunk.

    ``orig_index`` is the position of the first removed line *within the hunk's context*; the
    applier shifts it by the position where the context was found.
    """

    orig_index: int
    del_lines: tuple[str, ...]
    ins_lines: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Hunk:
    """One parsed ``@@`` section of an update diff.

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
    """Parse an update diff into hunks (§5b.2). Parsing stops at envelope markers.

    Only the first hunk may omit its ``@@`` header. A line that is exactly empty is context
    with empty content. An empty diff yields no hunks (applying it is a no-op).
    ``line_offset`` and ``path`` only change error messages (see :func:`parse_create_diff`).
    """
    lines = split_diff_lines(diff)
    total = len(lines)
    hunks: list[Hunk] = []
    i = 0
    while i < total and not lines[i].startswith(_STOP_PREFIXES):
        start = i
        anchors: list[str] = []
        while i < total and (lines[i] == "@@" or lines[i].startswith("@@ ")):
            anchor = lines[i][3:]
            if anchor.strip():
                anchors.append(anchor)
            i += 1
        header_count = i - start
        if i < total and lines[i].startswith("@@"):
            raise PatchParseError(
                reason="Invalid Line",
                line_number=line_offset + i + 1,
                line=lines[i],
                expected="a hunk header: '@@' alone, or '@@ ' (with a space) then anchor text",
                path=path,
            )
        body_start = i
        context, chunks, eof, i = _parse_body(lines, i, line_offset, path)
        if i == body_start and not eof and header_count == 0 and hunks:
            raise PatchParseError(
                reason="Invalid Line",
                line_number=line_offset + i + 1,
                line=lines[i],
                expected="an '@@' header: every hunk after the first must start with one",
                path=path,
            )
        if i == body_start and not eof:  # "@@" + "*** End of File" alone is a no-op hunk
            raise EmptyHunkError(
                reason="Nothing in this section",
                line_number=line_offset + i + 1 if i < total else None,
                line=lines[i] if i < total else None,
                expected="at least one ' ', '-' or '+' line after the '@@' header"
                if header_count
                else "a hunk: '@@' header lines followed by ' ', '-' or '+' lines",
                path=path,
            )
        if eof:
            i += 1  # the marker belongs to this hunk; more hunks may follow it
        hunks.append(
            Hunk(
                anchors=tuple(anchors),
                header_count=header_count,
                context=tuple(context),
                chunks=tuple(chunks),
                eof=eof,
                line_number=line_offset + start + 1,
            )
        )
    return hunks


def _parse_body(
    lines: list[str], i: int, line_offset: int, path: str | None
) -> tuple[list[str], list[Chunk], bool, int]:
    """Read one hunk body from ``lines[i]``; return (context, chunks, eof, next index).

    The terminating line is *not* consumed: the caller decides whether it starts a new hunk
    or ends the diff (``*** End of File`` and the envelope markers end it).
    """
    total = len(lines)
    context: list[str] = []
    chunks: list[Chunk] = []
    dels: list[str] = []
    ins: list[str] = []
    chunk_start = -1
    eof = False
    while i < total:
        line = lines[i]
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
        elif line.startswith("@@"):
            break
        elif line == "***" or line.startswith(_STOP_PREFIXES):
            eof = line.startswith(EOF_MARKER)
            break
        else:
            raise PatchParseError(
                reason="Invalid Line",
                line_number=line_offset + i + 1,
                line=line,
                expected=_BODY_EXPECTED,
                path=path,
            )
        i += 1
    if chunk_start >= 0:
        chunks.append(Chunk(chunk_start, tuple(dels), tuple(ins)))
    return context, chunks, eof, i


# --------------------------------------------------------------------------- searching


class _Haystack:
    """The file's lines under one normalization, with the searches the applier needs.

    Searches scan forward with ``list.index``. Scanning is cheapest while hunks are found
    near the cursor, but a miss costs a scan to the end of the file; once misses have
    wasted about ``rebuild_factor`` whole-file scans, a line -> positions index is built so
    the remaining searches are O(log n) per candidate instead of O(n).
    """

    __slots__ = ("_positions", "_seen", "_seen_upto", "_wasted", "lines", "rebuild_factor")

    def __init__(self, lines: list[str], rebuild_factor: int = 4) -> None:
        self.lines = lines
        self.rebuild_factor = rebuild_factor
        self._positions: dict[str, list[int]] | None = None
        self._seen: set[str] = set()
        self._seen_upto = 0
        self._wasted = 0

    def _missed(self, scanned: int) -> None:
        self._wasted += max(scanned, 1)
        if self._positions is None and self._wasted > self.rebuild_factor * len(self.lines):
            positions: dict[str, list[int]] = {}
            for index, line in enumerate(self.lines):
                positions.setdefault(line, []).append(index)
            self._positions = positions

    def occurs_before(self, line: str, stop: int) -> bool:
        """Whether ``line`` is one of ``lines[:stop]`` (amortized O(1) as ``stop`` grows)."""
        if self._positions is not None:
            found = self._positions.get(line)
            return found is not None and found[0] < stop
        if stop > self._seen_upto:
            self._seen.update(self.lines[self._seen_upto : stop])
            self._seen_upto = stop
        if stop == self._seen_upto:
            return line in self._seen
        return line in self.lines[:stop]

    def find_line(self, line: str, start: int, end: int | None = None) -> int:
        """Index of the first ``line`` in ``lines[start:end]``, or -1."""
        stop = len(self.lines) if end is None else end
        if self._positions is not None:
            found = self._positions.get(line)
            if found is None:
                return -1
            k = bisect_left(found, start)
            return found[k] if k < len(found) and found[k] < stop else -1
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
        pivot = max(range(size), key=lambda k: len(needle[k]))
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
            self._rstripped = _Haystack([line.rstrip() for line in self.lines])
        return self._rstripped

    @property
    def stripped(self) -> _Haystack:
        if self._stripped is None:
            self._stripped = _Haystack([line.strip() for line in self.lines])
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


def _most_similar(lines: list[str], targets: list[str], cursor: int) -> int | None:
    """Index of the file line most similar to any of ``targets`` (error path only)."""
    wanted = [t.strip() for t in targets if t.strip()]
    if not wanted or not lines:
        return None
    first_at: dict[str, int] = {}
    for index, line in enumerate(lines):
        key = line.strip()
        if key and (key not in first_at or (first_at[key] < cursor <= index)):
            first_at[key] = index
    best_key: str | None = None
    best_ratio = 0.0
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
    if best_key is None or best_ratio < 0.5:
        return None
    return first_at[best_key]


def _near_miss(lines: list[str], context: tuple[str, ...], cursor: int) -> tuple[int, int, bool]:
    """Describe the closest place the context almost matches (error path only).

    Every file line equal (ignoring surrounding whitespace) to a context line votes for an
    alignment of the whole context. The best-voted alignment is where the model most likely
    meant; the first context line that differs there is the one to fix. Returns
    ``(file index, context index, found_before_cursor)``; file index -1 if there is no hint.
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
            return best, 0, best < cursor
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
    index, offset, before = _near_miss(file.lines, hunk.context, cursor)
    return ContextNotFoundError(
        hunk_index=number,
        cursor=cursor,
        context=hunk.context,
        eof=hunk.eof,
        nearest_line=file.lines[index] if index >= 0 else None,
        nearest_line_number=index + 1 if index >= 0 else None,
        expected_line=hunk.context[offset] if index >= 0 and hunk.context else None,
        found_before_cursor=before,
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
    return "\r\n" if "\r\n" in source else "\n"


def apply_diff_detailed(
    text: str, diff: str, mode: DiffMode = "default", *, max_fuzz: int | None = None
) -> DiffResult:
    """Like :func:`apply_diff`, but also report the fuzz score and hunk count."""
    if mode not in ("default", "create"):
        message = f"mode must be 'default' or 'create', not {mode!r}"
        raise ValueError(message)
    newline = _newline_style(text, diff, mode)
    if mode == "create":
        created = parse_create_diff(diff)
        return DiffResult(text=newline.join(created), fuzz=0, hunks=1 if created else 0)
    hunks = parse_update_diff(diff)
    normalized = text.replace("\r\n", "\n") if "\r\n" in text else text
    file = _File(normalized.split("\n"))
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
        cursor, anchor_fuzz = _seek_anchors(file, hunk, cursor, number)
        found, context_fuzz = _find_hunk(file, hunk, cursor, number)
        fuzz += anchor_fuzz + context_fuzz
        if max_fuzz is not None and fuzz > max_fuzz:
            raise FuzzLimitError(fuzz=fuzz, max_fuzz=max_fuzz, hunk_index=number)
        cursor = found + len(hunk.context)
        edits.extend((found + chunk.orig_index, chunk, number) for chunk in hunk.chunks)
    return DiffResult(text=newline.join(_splice(file.lines, edits)), fuzz=fuzz, hunks=len(hunks))


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
    matcher = difflib.SequenceMatcher(None, before, after, autojunk=False)
    haystack = _Haystack(before)
    out: list[str] = []
    cursor = 0
    for group in matcher.get_grouped_opcodes(context):
        lo, hi = group[0][1], group[-1][2]
        start = _shortest_unique_start(haystack, cursor, lo, hi)
        out.append("@@")
        out.extend(" " + line for line in before[start:lo])
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out.extend(" " + line for line in before[i1:i2])
                continue
            out.extend("-" + line for line in before[i1:i2])
            out.extend("+" + line for line in after[j1:j2])
        cursor = hi
    if any(line.endswith("\r") for line in out):
        message = "make_diff cannot express a line that ends with a carriage return"
        raise ValueError(message)
    diff_newline = "\n" if "\n" in old else newline
    return diff_newline.join(out) + diff_newline
