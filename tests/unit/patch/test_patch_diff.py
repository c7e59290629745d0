"""V4A diff parsing and applying: one test per behaviour in wire spec §5b.2-§5b.3.

Expected values come from the spec (and, where it is terse, from what the reference
applier does), so these tests double as an executable summary of the format.
"""

from __future__ import annotations

import time

import pytest

from shellbox.patch import (
    EOF_FUZZ,
    AnchorNotFoundError,
    ChunkError,
    ContextNotFoundError,
    EmptyHunkError,
    FuzzLimitError,
    InvalidAddFileLineError,
    PatchError,
    PatchParseError,
    apply_diff,
    apply_diff_detailed,
    make_diff,
    parse_update_diff,
)
from shellbox.patch.diff import (
    _apply_joined,
    _apply_lines,
    _newline_style,
    _uniform_separator,
)

TWO_BODIES = "def a():\n    return 1\n\ndef b():\n    return 1\n"
CLASSES = (
    "class A:\n    def m(self):\n        return 'a'\n\n"
    "class B:\n    def m(self):\n        return 'b'\n"
)


def both_paths(text: str, diff: str) -> str:
    """Apply with the public function, and check the line path agrees with it."""
    result = apply_diff(text, diff)
    newline = _newline_style(text, diff, "default")
    assert _apply_lines(text, parse_update_diff(diff), newline, None).text == result
    return result


# --------------------------------------------------------------------------- behaviour table


class TestBehaviourTable:
    """The "Verified behaviours" table of §5b.3, one test per row."""

    def test_anchor_edits_the_second_of_two_identical_bodies(self) -> None:
        diff = "@@ def b():\n-    return 1\n+    return 2\n"
        assert both_paths(TWO_BODIES, diff) == (
            "def a():\n    return 1\n\ndef b():\n    return 2\n"
        )

    def test_first_hunk_without_header_is_allowed(self) -> None:
        assert both_paths("a\nb\nc\n", " b\n-c\n+C\n") == "a\nb\nC\n"

    def test_end_of_file_hunk_appends_after_the_last_real_line(self) -> None:
        assert both_paths("a\nb\n", "@@\n+c\n*** End of File\n") == "a\nb\nc\n"
        assert both_paths("a\nb", "@@\n+c\n*** End of File\n") == "a\nb\nc"

    def test_crlf_input_keeps_crlf(self) -> None:
        assert both_paths("a\r\nb\r\nc\r\n", "@@\n a\n-b\n+B\n") == "a\r\nB\r\nc\r\n"

    def test_context_differing_only_in_surrounding_whitespace_still_matches(self) -> None:
        text = "  if x:   \n\tgo()\n"
        result = apply_diff_detailed(text, "@@\n if x:\n-go()\n+stop()\n")
        assert result.text == "  if x:   \nstop()\n"
        assert result.fuzz == 100  # matched only after strip() on both sides

    def test_stacked_anchors_pick_the_method_in_class_b(self) -> None:
        diff = "@@ class B:\n@@   def m(self):\n-        return 'b'\n+        return 'B'\n"
        assert both_paths(CLASSES, diff) == CLASSES.replace("'b'", "'B'")

    def test_blank_line_in_hunk_is_empty_context(self) -> None:
        diff = "@@\n a\n\n-b\n+B\n"
        assert both_paths("a\n\nb\n", diff) == "a\n\nB\n"
        with pytest.raises(ContextNotFoundError):
            apply_diff("a\nx\nb\n", diff)  # the blank context line must match a blank line


# --------------------------------------------------------------------------- create mode


class TestCreate:
    def test_trailing_newline_of_diff_does_not_become_a_final_newline(self) -> None:
        assert apply_diff("", "+a\n+b\n", "create") == "a\nb"

    def test_final_empty_plus_line_ends_file_with_newline(self) -> None:
        assert apply_diff("", "+a\n+b\n+\n", "create") == "a\nb\n"

    def test_crlf_diff_creates_crlf_file(self) -> None:
        assert apply_diff("", "+a\r\n+b\r\n+\r\n", "create") == "a\r\nb\r\n"

    def test_empty_diff_creates_empty_file(self) -> None:
        assert apply_diff("", "", "create") == ""

    def test_input_text_is_ignored(self) -> None:
        assert apply_diff("old\n", "+new\n", "create") == "new"

    def test_unicode(self) -> None:
        assert (
            apply_diff("", "+héllo wörld 🌍\n+日本語\n+\n", "create") == "héllo wörld 🌍\n日本語\n"
        )

    @pytest.mark.parametrize("line", ["a", " a", "", "@@", "***", "*** End of File", "-a"])
    def test_line_without_plus_is_invalid_add_file_line(self, line: str) -> None:
        with pytest.raises(InvalidAddFileLineError) as info:
            apply_diff("", f"+ok\n{line}\n+more\n", "create")
        message = str(info.value)
        assert message.startswith("Invalid Add File Line at line 2")
        assert repr(line) in message
        assert "start with '+'" in message
        assert info.value.line_number == 2

    def test_envelope_marker_ends_a_create_diff(self) -> None:
        assert apply_diff("", "+a\n*** End Patch\n+b\n", "create") == "a"
        assert apply_diff("", "+a\n*** Add File: x\n+b\n", "create") == "a"

    def test_unknown_mode_is_rejected(self) -> None:
        with pytest.raises(ValueError, match="mode"):
            apply_diff("", "+a\n", "update")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- diff syntax


class TestParse:
    def test_hunk_structure(self) -> None:
        (hunk,) = parse_update_diff("@@ def f():\n a\n-b\n+B\n c\n+d\n")
        assert hunk.anchors == ("def f():",)
        assert hunk.header_count == 1
        assert hunk.context == ("a", "b", "c")
        assert [(c.orig_index, c.del_lines, c.ins_lines) for c in hunk.chunks] == [
            (1, ("b",), ("B",)),
            (3, (), ("d",)),
        ]
        assert not hunk.eof
        assert hunk.line_number == 1

    def test_bare_and_blank_headers_count_but_keep_no_anchor(self) -> None:
        (hunk,) = parse_update_diff("@@\n@@   \n@@ x\n a\n")
        assert hunk.header_count == 3
        assert hunk.anchors == ("x",)

    def test_crlf_diff_lines_are_normalized(self) -> None:
        assert parse_update_diff("@@ f\r\n a\r\n+b\r\n") == parse_update_diff("@@ f\n a\n+b\n")

    def test_end_of_file_marker_closes_hunk_and_more_hunks_may_follow(self) -> None:
        hunks = parse_update_diff("@@\n a\n+x\n*** End of File\n@@\n b\n+y\n")
        assert [h.eof for h in hunks] == [True, False]

    @pytest.mark.parametrize(
        "marker", ["*** End Patch", "*** Update File: b", "*** Delete File: b", "*** Add File: b"]
    )
    def test_envelope_marker_ends_the_diff(self, marker: str) -> None:
        hunks = parse_update_diff(f"@@\n a\n+x\n{marker}\n@@\n b\n+y\n")
        assert len(hunks) == 1

    def test_empty_diff_is_a_no_op(self) -> None:
        assert parse_update_diff("") == []
        assert apply_diff("a\nb\n", "") == "a\nb\n"

    def test_header_with_nothing_after_it(self) -> None:
        with pytest.raises(EmptyHunkError, match="Nothing in this section"):
            apply_diff("a\n", "@@ a\n")

    def test_header_then_end_of_file_alone_is_a_no_op(self) -> None:
        assert apply_diff("a\n", "@@\n*** End of File\n") == "a\n"

    def test_header_needs_a_space_before_its_anchor(self) -> None:
        with pytest.raises(PatchParseError) as info:
            apply_diff("a\n", "@@a\n a\n")
        assert "Invalid Line at line 1: '@@a'" in str(info.value)
        assert "'@@ ' (with a space)" in str(info.value)

    def test_unknown_star_line_is_invalid(self) -> None:
        with pytest.raises(PatchParseError, match=r"Invalid Line at line 3: '\*\*\* Bogus'"):
            apply_diff("a\n", "@@\n a\n*** Bogus\n")

    def test_triple_star_line_ends_hunk_and_then_fails(self) -> None:
        with pytest.raises(PatchParseError, match="Invalid Line at line 4") as info:
            apply_diff("a\nb\n", "@@\n a\n+x\n***\n@@\n b\n")
        assert "every hunk after the first" in str(info.value)

    def test_line_without_prefix_is_invalid(self) -> None:
        with pytest.raises(PatchParseError) as info:
            apply_diff("a\nb\n", "@@\n a\nb\n")
        message = str(info.value)
        assert message.startswith("Invalid Line at line 3: 'b'")
        assert "starting with ' ' (unchanged context)" in message
        assert info.value.line_number == 3
        assert info.value.line == "b"

    def test_only_the_first_hunk_may_omit_the_header(self) -> None:
        # After an end-of-file hunk a new hunk can start without '@@'; it is only accepted
        # while the cursor is still at the top of the file, as in the reference.
        with pytest.raises(PatchParseError, match="only the first hunk may omit it"):
            apply_diff("x\n", "+a\n*** End of File\n+b\n")
        assert apply_diff("", "+x\n*** End of File\n+y\n") == "x\ny\n"


# --------------------------------------------------------------------------- applying


class TestApply:
    def test_trailing_newline_is_kept_or_left_absent(self) -> None:
        assert both_paths("a\nb\n", "@@\n-b\n+c\n") == "a\nc\n"
        assert both_paths("a\nb", "@@\n-b\n+c\n") == "a\nc"

    def test_final_newline_can_be_removed_or_added(self) -> None:
        assert both_paths("a\nb\n", "@@\n b\n-\n") == "a\nb"
        assert both_paths("a\nb", "@@\n b\n+\n") == "a\nb\n"

    def test_crlf_file_patched_with_crlf_diff(self) -> None:
        assert both_paths("a\r\nb\r\n", "@@\r\n a\r\n+x\r\n") == "a\r\nx\r\nb\r\n"

    def test_crlf_without_final_newline(self) -> None:
        assert both_paths("a\r\nb", "@@\n a\n-b\n+c\n") == "a\r\nc"

    def test_mixed_line_endings_become_crlf(self) -> None:
        assert both_paths("a\r\nb\nc\n", "@@\n-a\n+A\n") == "A\r\nb\r\nc\r\n"

    def test_lf_file_ignores_crlf_diff(self) -> None:
        assert both_paths("a\nb\n", "@@\r\n-a\r\n+A\r\n") == "A\nb\n"

    def test_file_without_newline_takes_style_from_diff(self) -> None:
        assert both_paths("a", "@@\r\n a\r\n+b\r\n") == "a\r\nb"
        assert both_paths("a", "@@\n a\n+b\n") == "a\nb"

    def test_unicode(self) -> None:
        text = "naïve = 'café'\nπ = 3.14159\n# 🚀 launch\n"
        diff = "@@\n naïve = 'café'\n-π = 3.14159\n+π = 3.14159265\n # 🚀 launch\n+# ✓\n"
        assert both_paths(text, diff) == "naïve = 'café'\nπ = 3.14159265\n# 🚀 launch\n# ✓\n"

    def test_empty_file(self) -> None:
        assert both_paths("", "@@\n+hello\n") == "hello\n"
        assert both_paths("", "@@\n+hello\n*** End of File\n") == "hello\n"
        assert both_paths("", "@@\n-\n+hello\n") == "hello"

    def test_multi_hunk_with_stacked_anchors(self) -> None:
        text = CLASSES + "\n\nclass C:\n    def m(self):\n        return 'c'\n"
        diff = (
            "@@ class A:\n@@     def m(self):\n-        return 'a'\n+        return 'A'\n"
            "@@ class C:\n@@     def m(self):\n-        return 'c'\n+        return 'C'\n"
        )
        expected = text.replace("'a'", "'A'").replace("'c'", "'C'")
        assert both_paths(text, diff) == expected

    def test_anchor_found_before_cursor_keeps_cursor(self) -> None:
        # Hunk 2's anchor 'a' is only before the cursor, so it counts as found and the
        # context is searched from where hunk 1 ended.
        text = "a\nx\nb\nx\n"
        assert both_paths(text, "@@\n a\n+1\n@@ a\n x\n+2\n") == "a\n1\nx\n2\nb\nx\n"

    def test_single_missing_anchor_is_ignored(self) -> None:
        assert both_paths("a\nb\n", "@@ zzz\n a\n+x\n") == "a\nx\nb\n"

    def test_stacked_missing_anchor_is_an_error(self) -> None:
        with pytest.raises(AnchorNotFoundError) as info:
            apply_diff(CLASSES, "@@ class Z:\n@@   def m(self):\n-x\n")
        error = info.value
        assert error.hunk_index == 1
        assert error.anchor == "class Z:"
        assert str(error).startswith("Invalid Anchor 0:\nclass Z:\n")
        assert "Hunk 1" in str(error)

    def test_second_stacked_anchor_searches_forward_only(self) -> None:
        with pytest.raises(AnchorNotFoundError, match="Invalid Anchor 1:\na"):
            apply_diff("a\n", "@@ a\n@@ a\n+x\n")

    def test_anchor_matching_only_after_strip_adds_fuzz(self) -> None:
        result = apply_diff_detailed(
            "  def f():\n    pass\n", "@@ def f():\n-    pass\n+    return\n"
        )
        assert result.text == "  def f():\n    return\n"
        assert result.fuzz == 1

    def test_exact_pass_wins_over_earlier_loose_match(self) -> None:
        # "x " matches "x" only after rstrip; the exact "x" further down wins.
        result = apply_diff_detailed("x \ny\nx\ny\n", "@@\n x\n-y\n+Y\n")
        assert result.text == "x \ny\nx\nY\n"
        assert result.fuzz == 0

    def test_trailing_whitespace_difference_costs_fuzz_1(self) -> None:
        result = apply_diff_detailed("a  \nb\n", "@@\n a\n-b\n+B\n")
        assert (result.text, result.fuzz) == ("a  \nB\n", 1)

    def test_context_lines_keep_the_file_whitespace(self) -> None:
        assert apply_diff("  a  \nb\n", "@@\n a\n-b\n+B\n") == "  a  \nB\n"

    def test_end_of_file_prefers_the_end(self) -> None:
        text = "x\ny\nx\ny\n"
        assert both_paths(text, "@@\n x\n y\n+z\n*** End of File\n") == "x\ny\nx\ny\nz\n"

    def test_end_of_file_falls_back_to_search_with_big_fuzz(self) -> None:
        result = apply_diff_detailed("a\nb\nc\n", "@@\n a\n-b\n+x\n*** End of File\n")
        assert result.text == "a\nx\nc\n"
        assert result.fuzz == EOF_FUZZ
        with pytest.raises(FuzzLimitError) as info:
            apply_diff("a\nb\nc\n", "@@\n a\n-b\n+x\n*** End of File\n", max_fuzz=EOF_FUZZ - 1)
        assert info.value.fuzz == EOF_FUZZ
        assert "hunk 1" in str(info.value)

    def test_end_of_file_context_does_not_match_the_final_empty_element(self) -> None:
        with pytest.raises(ContextNotFoundError, match="Invalid EOF Context 0:") as info:
            apply_diff("b\nc\n", "@@\n c\n\n*** End of File\n")
        assert info.value.found_past_end
        assert "Drop the trailing blank context line" in str(info.value)
        assert both_paths("b\nc\n\n", "@@\n c\n\n+d\n*** End of File\n") == "b\nc\n\nd\n"

    def test_empty_context_inserts_at_cursor(self) -> None:
        assert both_paths("a\nb\n", "@@\n+top\n") == "top\na\nb\n"
        assert both_paths("a\nb\n", "@@ a\n+after a\n") == "a\nafter a\nb\n"

    def test_many_hunks_in_order(self) -> None:
        text = "".join(f"line {i}\n" for i in range(100))
        diff = "".join(f"@@\n line {i}\n-line {i + 1}\n+LINE {i + 1}\n" for i in range(0, 98, 10))
        expected = text
        for i in range(0, 98, 10):
            expected = expected.replace(f"line {i + 1}\n", f"LINE {i + 1}\n")
        assert both_paths(text, diff) == expected

    def test_overlapping_chunks_are_rejected(self) -> None:
        # Hunk 2's end-of-file context is the line hunk 1 already changed.
        with pytest.raises(ChunkError, match="overlapping chunk") as info:
            apply_diff("a\nb\n", "@@\n a\n-b\n+B\n@@\n-b\n+C\n*** End of File\n")
        assert info.value.hunk_index == 2
        assert "hunk 2 changes line 2" in str(info.value)

    def test_max_fuzz_zero_rejects_whitespace_fuzz(self) -> None:
        with pytest.raises(FuzzLimitError):
            apply_diff("a  \nb\n", "@@\n a\n-b\n+B\n", max_fuzz=0)
        assert apply_diff("a\nb\n", "@@\n a\n-b\n+B\n", max_fuzz=0) == "a\nB\n"
        with pytest.raises(ValueError, match="max_fuzz"):
            apply_diff("a\n", "", max_fuzz=-1)


# --------------------------------------------------------------------------- failure messages


class TestFailureMessages:
    TEXT = "def a():\n    x = 1\n    y = 2\n    return x + y\n\ndef b():\n    return 3\n"

    def test_context_not_found_names_hunk_context_and_nearest_line(self) -> None:
        diff = "@@ def a():\n     x = 1\n-    y = 3\n+    y = 4\n"
        with pytest.raises(ContextNotFoundError) as info:
            apply_diff(self.TEXT, diff)
        error = info.value
        message = str(error)
        assert message.startswith("Invalid Context 1:\n    x = 1\n    y = 3\n")
        assert "Hunk 1: its 2 context lines were not found at or after line 2." in message
        assert "Nearest almost-matching line is line 3: '    y = 2'" in message
        assert "compared with the context line '    y = 3'" in message
        assert error.hunk_index == 1
        assert error.context == ("    x = 1", "    y = 3")
        assert error.nearest_line == "    y = 2"
        assert error.nearest_line_number == 3
        assert error.expected_line == "    y = 3"

    def test_hunk_index_is_one_based_and_counts_hunks(self) -> None:
        diff = "@@\n def a():\n+    # first\n@@\n def b():\n-    return 4\n+    return 5\n"
        with pytest.raises(ContextNotFoundError) as info:
            apply_diff(self.TEXT, diff)
        assert info.value.hunk_index == 2
        assert "Hunk 2:" in str(info.value)
        assert info.value.nearest_line_number == 7
        assert "line 7: '    return 3'" in str(info.value)

    def test_out_of_order_hunks_are_explained(self) -> None:
        diff = (
            "@@\n def b():\n-    return 3\n+    return 4\n@@\n def a():\n-    x = 1\n+    x = 5\n"
        )
        with pytest.raises(ContextNotFoundError) as info:
            apply_diff(self.TEXT, diff)
        assert info.value.found_before_cursor
        assert "They do appear at line 1" in str(info.value)
        assert "Hunks and anchors must be in file order" in str(info.value)

    def test_similar_line_found_when_no_context_line_matches(self) -> None:
        with pytest.raises(ContextNotFoundError) as info:
            apply_diff(self.TEXT, "@@\n-    retrun x + y\n+    return y\n")
        assert info.value.nearest_line_number == 4
        assert "line 4: '    return x + y'" in str(info.value)

    def test_no_similar_line(self) -> None:
        with pytest.raises(ContextNotFoundError) as info:
            apply_diff(self.TEXT, "@@\n-completely unrelated content here\n")
        assert info.value.nearest_line is None
        assert "No similar line was found" in str(info.value)

    def test_end_of_file_context_error(self) -> None:
        with pytest.raises(ContextNotFoundError) as info:
            apply_diff(self.TEXT, "@@\n-    return 4\n*** End of File\n")
        assert str(info.value).startswith("Invalid EOF Context 0:\n    return 4\n")
        assert info.value.eof
        assert "at the end of the file" in str(info.value)
        assert info.value.nearest_line_number == 7

    def test_anchor_error_suggests_nearest_line(self) -> None:
        with pytest.raises(AnchorNotFoundError) as info:
            apply_diff(self.TEXT, "@@ def bb():\n@@ def a():\n-    x = 1\n")
        assert info.value.nearest_line_number == 6
        assert "line 6: 'def b():'" in str(info.value)

    def test_errors_share_a_base_class(self) -> None:
        with pytest.raises(PatchError):
            apply_diff("a\n", "@@\n-b\n")
        with pytest.raises(ValueError):
            apply_diff("a\n", "@@\n-b\n")


# --------------------------------------------------------------------------- fast path


class TestJoinedFastPath:
    """The exact-match fast path must agree with the general line path or step aside."""

    @pytest.mark.parametrize(
        ("text", "diff"),
        [
            ("a\nb\nc\n", "@@\n a\n-b\n+B\n"),
            ("a\r\nb\r\nc\r\n", "@@\n a\n-b\n+B\n"),
            ("a\nb\nc", "@@\n b\n-c\n+C\n"),
            ("a\nb\n", "@@\n b\n+c\n*** End of File\n"),
            ("a\nb\n", "@@\n+c\n*** End of File\n"),
            ("\n", "@@\n\n+x\n*** End of File\n"),
            (TWO_BODIES, "@@ def b():\n-    return 1\n+    return 2\n"),
            ("a\nx\nb\nx\n", "@@\n a\n+1\n@@ a\n x\n+2\n"),
            ("a\nb\n", "@@ a\n+after a\n"),
            ("a\nb\n", "@@\n b\n-\n"),
            ("x\ny\n", "@@\n-x\n-y\n-\n"),
        ],
    )
    def test_agrees_with_line_path(self, text: str, diff: str) -> None:
        hunks = parse_update_diff(diff)
        separator = _uniform_separator(text)
        assert separator is not None
        fast = _apply_joined(text, hunks, separator)
        assert fast is not None
        assert fast == _apply_lines(text, hunks, separator, None).text

    @pytest.mark.parametrize(
        ("text", "diff"),
        [
            ("a  \nb\n", "@@\n a\n-b\n+B\n"),  # needs fuzz
            (CLASSES, "@@ class B:\n@@   def m(self):\n-        return 'b'\n"),  # stacked
            ("a\nb\nc\n", "@@\n a\n-b\n+x\n*** End of File\n"),  # EOF not at the end
        ],
    )
    def test_steps_aside(self, text: str, diff: str) -> None:
        assert _apply_joined(text, parse_update_diff(diff), "\n") is None

    def test_mixed_or_newline_free_text_uses_line_path(self) -> None:
        assert _uniform_separator("a\r\nb\n") is None
        assert _uniform_separator("abc") is None
        assert _uniform_separator("a\r\nb\r\n") == "\r\n"


# --------------------------------------------------------------------------- scaling


def test_large_many_hunk_patch_is_linear() -> None:
    """A 2 000-hunk patch on a 100 000-line file: quadratic scans would take minutes."""
    lines = [f"    value_{i} = compute({i})" for i in range(100_000)]
    text = "\n".join(lines) + "\n"
    hunks = []
    for i in range(25, 100_000, 50):
        hunks.append(f"@@ {lines[i - 5]}\n {lines[i - 1]}\n-{lines[i]}\n+    changed_{i}\n")
    diff = "".join(hunks)
    started = time.perf_counter()
    result = apply_diff(text, diff)
    fuzzed = apply_diff(text.replace("\n", "  \n"), diff)  # every hunk needs fuzz
    elapsed = time.perf_counter() - started
    assert result.count("changed_") == 2000
    assert fuzzed.count("changed_") == 2000
    assert elapsed < 10


def test_make_diff_on_large_file_is_fast() -> None:
    old = "".join(f"line {i}\n" for i in range(50_000))
    new = old.replace("line 7\n", "seven\n").replace("line 49999\n", "")
    started = time.perf_counter()
    diff = make_diff(old, new)
    assert apply_diff(old, diff) == new
    assert time.perf_counter() - started < 10
