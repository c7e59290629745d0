"""Property tests: generated diffs round-trip, the two apply paths agree, errors stay typed.

Texts are drawn from a handful of short lines so that repeated lines, which make V4A's
search-based hunk placement ambiguous, are the norm rather than the exception.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shellbox.patch import (
    DiffMode,
    PatchError,
    PatchOperation,
    apply_diff,
    format_patch,
    make_diff,
    parse_patch,
    parse_update_diff,
)
from shellbox.patch.diff import (
    _apply_joined,
    _apply_lines,
    _Haystack,
    _newline_style,
    _uniform_separator,
)

SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

MODES: tuple[DiffMode, ...] = ("default", "create")
LINES = st.sampled_from(["a", "b", "c", "", "  a", "a  ", "\tb", "é", "x = 1", "}", "@@", "***"])


@st.composite
def texts(draw: st.DrawFn, newline: str | None = None) -> str:
    """A file: lines from a small alphabet, LF or CRLF, with or without a final newline."""
    lines = draw(st.lists(LINES, max_size=14))
    sep = newline if newline is not None else draw(st.sampled_from(["\n", "\r\n"]))
    final_newline = draw(st.booleans())
    return sep.join(lines) + (sep if lines and final_newline else "")


@st.composite
def text_pairs(draw: st.DrawFn) -> tuple[str, str]:
    """Old and new text in the same newline style (what an update can express)."""
    sep = draw(st.sampled_from(["\n", "\r\n"]))
    old = draw(texts(newline=sep))
    if draw(st.booleans()):  # often a small edit of old, so hunks have real context
        lines = old.split(sep)
        edits = draw(st.lists(st.tuples(st.integers(0, 20), LINES, st.booleans()), max_size=4))
        for index, line, insert in edits:
            index %= len(lines) + 1
            if insert or index == len(lines):
                lines.insert(index, line)
            else:
                lines[index] = line
        return old, sep.join(lines)
    return old, draw(texts(newline=sep))


@SETTINGS
@given(text_pairs(), st.sampled_from([0, 1, 3]))
def test_make_diff_round_trips(pair: tuple[str, str], context: int) -> None:
    old, new = pair
    diff = make_diff(old, new, context)
    assert apply_diff(old, diff) == new
    hunks = parse_update_diff(diff)
    assert _apply_lines(old, hunks, _newline_style(old, diff, "default"), None).text == new


@SETTINGS
@given(st.sampled_from(["", "a", "b c"]), texts())
def test_make_diff_from_newline_free_text(old: str, new: str) -> None:
    # Without a newline in the old text the style comes from the diff, so any uniform
    # style in the new text can be produced.
    assert apply_diff(old, make_diff(old, new)) == new


@SETTINGS
@given(texts())
def test_make_diff_of_identical_texts_is_empty(text: str) -> None:
    assert make_diff(text, text) == ""
    assert apply_diff(text, "") == text


def test_make_diff_refuses_what_it_cannot_express() -> None:
    with pytest.raises(ValueError, match="line endings"):
        make_diff("a\nb\n", "a\r\nb\r\n")
    with pytest.raises(ValueError, match="carriage return"):
        make_diff("a\n", "a\nb\r")
    with pytest.raises(ValueError, match="context"):
        make_diff("a", "b", context=-1)


@st.composite
def diffs_for(draw: st.DrawFn, text: str) -> str:
    """A diff that often fits ``text``: context lines are mostly taken from the file."""
    file_lines = text.replace("\r\n", "\n").split("\n")
    pieces: list[str] = []
    for _ in range(draw(st.integers(1, 4))):
        pieces.extend(
            draw(st.lists(st.sampled_from(["@@", "@@ a", "@@ b", "@@ x = 1"]), max_size=2))
        )
        start = draw(st.integers(0, len(file_lines)))
        for line in file_lines[start : start + draw(st.integers(0, 3))]:
            pieces.append(draw(st.sampled_from([" ", "-", " "])) + line)
        pieces.extend("+" + line for line in draw(st.lists(LINES, max_size=2)))
        if draw(st.integers(0, 5)) == 0:
            pieces.append("*** End of File")
    return "\n".join(pieces) + "\n"


@SETTINGS
@given(st.data())
def test_fast_path_agrees_with_line_path(data: st.DataObject) -> None:
    text = data.draw(texts())
    diff = data.draw(diffs_for(text))
    try:
        hunks = parse_update_diff(diff)
    except PatchError:
        return
    separator = _uniform_separator(text)
    if separator is None:
        return
    fast = _apply_joined(text, hunks, separator)
    if fast is not None:  # None: the fast path stepped aside, which is always allowed
        assert fast == _apply_lines(text, hunks, separator, None).text


@SETTINGS
@given(st.data())
def test_only_patch_errors_escape(data: st.DataObject) -> None:
    text = data.draw(texts())
    lines = st.one_of(
        st.builds(lambda p, s: p + s, st.sampled_from([" ", "-", "+", "@@ ", ""]), LINES),
        st.sampled_from(["@@", "*** End of File", "***", "*** End Patch", "@@x", "bad"]),
    )
    diff = "\n".join(data.draw(st.lists(lines, max_size=12)))
    mode = data.draw(st.sampled_from(MODES))
    try:
        result = apply_diff(text, diff, mode)
    except PatchError as error:
        assert str(error)
    else:
        assert isinstance(result, str)


@SETTINGS
@given(st.data())
def test_context_errors_name_a_real_hunk_and_line(data: st.DataObject) -> None:
    from shellbox.patch import ContextNotFoundError

    text = data.draw(texts())
    diff = data.draw(diffs_for(text))
    try:
        apply_diff(text, diff)
    except ContextNotFoundError as error:
        assert 1 <= error.hunk_index <= len(parse_update_diff(diff))
        assert f"Hunk {error.hunk_index}" in str(error)
        if error.nearest_line_number is not None:
            file_lines = text.replace("\r\n", "\n").split("\n")
            assert file_lines[error.nearest_line_number - 1] == error.nearest_line
    except PatchError:
        pass


PATHS = st.text(alphabet="abc/._-", min_size=1, max_size=10).filter(lambda p: p.strip() == p)


@st.composite
def operations(draw: st.DrawFn) -> PatchOperation:
    kind = draw(st.sampled_from(["create_file", "update_file", "delete_file"]))
    path = draw(PATHS)
    if kind == "delete_file":
        return PatchOperation(type="delete_file", path=path)
    if kind == "create_file":
        lines = draw(st.lists(LINES, min_size=1, max_size=4))
        return PatchOperation(type="create_file", path=path, diff="".join(f"+{x}\n" for x in lines))
    old, new = draw(text_pairs().filter(lambda pair: pair[0] != pair[1]))
    diff = make_diff(old.replace("\r\n", "\n"), new.replace("\r\n", "\n"))
    move_to = draw(st.none() | PATHS)
    return PatchOperation(type="update_file", path=path, diff=diff, move_to=move_to)


@SETTINGS
@given(st.lists(operations(), min_size=1, max_size=4))
def test_envelope_round_trips(ops: list[PatchOperation]) -> None:
    assert parse_patch(format_patch(ops)) == ops


# --------------------------------------------------------------------------- reference


@SETTINGS
@given(st.data())
def test_matches_the_agents_sdk_reference(data: st.DataObject) -> None:
    """Differential check against the Agents SDK applier, when it is installed."""
    reference = pytest.importorskip("agents.apply_diff").apply_diff
    text = data.draw(texts())
    diff = data.draw(diffs_for(text))
    mode = data.draw(st.sampled_from((*MODES, "default")))
    outcome: dict[str, Any] = {}
    for name, function in (("ours", apply_diff), ("reference", reference)):
        try:
            outcome[name] = ("ok", function(text, diff, mode))
        except ValueError:
            outcome[name] = ("error", None)
    assert outcome["ours"] == outcome["reference"]


@SETTINGS
@given(text_pairs(), st.sampled_from([0, 1, 3]))
def test_make_diff_output_works_with_the_agents_sdk(pair: tuple[str, str], context: int) -> None:
    """Diffs we generate are valid V4A for the reference applier too."""
    reference = pytest.importorskip("agents.apply_diff").apply_diff
    old, new = pair
    assert reference(old, make_diff(old, new, context)) == new


# --------------------------------------------------------------------------- search index


def naive_find(lines: list[str], needle: list[str], start: int, end: int) -> int:
    for index in range(start, end - len(needle) + 1):
        if lines[index : index + len(needle)] == needle:
            return index
    return start if not needle and start <= end else -1


@SETTINGS
@given(
    st.lists(st.sampled_from("abcd"), max_size=30),
    st.lists(st.tuples(st.lists(st.sampled_from("abcde"), max_size=3), st.integers(0, 32))),
    st.sampled_from(["scan", "last", "positions"]),
)
def test_haystack_searches_match_naive_search(
    lines: list[str], queries: list[tuple[list[str], int]], mode: str
) -> None:
    """Every search strategy (scan, last-occurrence map, position index) gives one answer."""
    haystack = _Haystack(lines, rebuild_factor=0 if mode == "positions" else 10**9)
    if mode != "scan":
        haystack.find_line("\0missing", 0)  # a miss builds the map (and, at 0, the index)
    for needle, start in queries:
        start = min(start, len(lines))
        end = len(lines) - (start % 2)  # also exercise a shortened search range
        assert haystack.find(needle, start, end) == naive_find(lines, needle, start, end)
        if needle:
            assert haystack.occurs_before(needle[0], start) == (needle[0] in lines[:start])
