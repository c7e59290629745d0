"""The ``*** Begin Patch`` envelope and the JSON operation forms (wire spec §5b.1-§5b.2)."""

from __future__ import annotations

import json

import pytest

from shellbox.patch import (
    InvalidAddFileLineError,
    InvalidOperationError,
    PatchOperation,
    PatchParseError,
    apply_diff,
    format_patch,
    operation_from_dict,
    parse_patch,
)

FULL = """*** Begin Patch
*** Add File: docs/new.md
+# Title
+
+body
*** Delete File: old.txt
*** Update File: src/app.py
*** Move to: src/main.py
@@ def main():
-    print("hi")
+    print("hello")
*** Update File: src/util.py
@@
 import os
+import sys
*** End of File
*** End Patch
"""


def test_full_envelope() -> None:
    assert parse_patch(FULL) == [
        PatchOperation(type="create_file", path="docs/new.md", diff="+# Title\n+\n+body\n"),
        PatchOperation(type="delete_file", path="old.txt"),
        PatchOperation(
            type="update_file",
            path="src/app.py",
            diff='@@ def main():\n-    print("hi")\n+    print("hello")\n',
            move_to="src/main.py",
        ),
        PatchOperation(
            type="update_file",
            path="src/util.py",
            diff="@@\n import os\n+import sys\n*** End of File\n",
        ),
    ]


def test_add_section_diff_applies_in_create_mode() -> None:
    (op,) = parse_patch("*** Begin Patch\n*** Add File: a.txt\n+one\n+two\n+\n*** End Patch")
    assert apply_diff("", op.diff, "create") == "one\ntwo\n"


def test_crlf_envelope_and_surrounding_blank_lines() -> None:
    text = (
        "\r\n\r\n*** Begin Patch\r\n*** Update File: a\r\n@@\r\n-x\r\n+y\r\n*** End Patch\r\n\r\n"
    )
    assert parse_patch(text) == [PatchOperation(type="update_file", path="a", diff="@@\n-x\n+y\n")]


def test_paths_are_trimmed() -> None:
    (op,) = parse_patch("*** Begin Patch\n*** Delete File:   spaced name.txt  \n*** End Patch")
    assert op.path == "spaced name.txt"


def test_move_without_other_sections() -> None:
    (op,) = parse_patch(
        "*** Begin Patch\n*** Update File: a.py\n*** Move to: b.py\n@@\n x\n*** End Patch"
    )
    assert (op.path, op.move_to) == ("a.py", "b.py")


# --------------------------------------------------------------------------- errors


def error_for(text: str) -> PatchParseError:
    with pytest.raises(PatchParseError) as info:
        parse_patch(text)
    return info.value


def test_missing_begin() -> None:
    error = error_for("*** Update File: a\n@@\n x\n*** End Patch\n")
    assert error.line_number == 1
    assert "Expected '*** Begin Patch' as the first line" in str(error)


def test_missing_end() -> None:
    error = error_for("*** Begin Patch\n*** Update File: a\n@@\n x\n")
    assert error.line_number == 4
    assert "Expected '*** End Patch' as the last line" in str(error)


def test_empty_input() -> None:
    assert "first line" in str(error_for("\n\n"))


def test_empty_patch() -> None:
    error = error_for("*** Begin Patch\n*** End Patch\n")
    assert str(error).startswith("Empty patch at line 2")


def test_garbage_between_sections() -> None:
    error = error_for("*** Begin Patch\nhello\n*** End Patch\n")
    assert error.line_number == 2
    assert "Invalid patch line at line 2: 'hello'" in str(error)
    assert "'*** Add File:', '*** Delete File:' or '*** Update File:'" in str(error)


def test_move_to_in_wrong_place() -> None:
    error = error_for("*** Begin Patch\n*** Delete File: a\n*** Move to: b\n*** End Patch\n")
    assert error.line_number == 3


def test_delete_section_must_be_empty() -> None:
    error = error_for("*** Begin Patch\n*** Delete File: a\n-x\n*** End Patch\n")
    assert error.line_number == 3
    assert error.path == "a"
    assert "Unexpected line in delete section" in str(error)


def test_add_section_needs_plus_lines() -> None:
    error = error_for("*** Begin Patch\n*** Add File: a\n*** End Patch\n")
    assert "Empty add section at line 2" in str(error)
    with pytest.raises(InvalidAddFileLineError) as info:
        parse_patch("*** Begin Patch\n*** Add File: a\n+ok\nno plus\n*** End Patch\n")
    assert info.value.line_number == 4
    assert "in the section for 'a'" in str(info.value)


def test_update_section_needs_lines() -> None:
    error = error_for("*** Begin Patch\n*** Update File: a\n*** End Patch\n")
    assert "Empty update section" in str(error)


def test_update_body_errors_use_envelope_line_numbers() -> None:
    text = (
        "*** Begin Patch\n*** Delete File: z\n*** Update File: a\n@@\n x\nbad line\n*** End Patch\n"
    )
    error = error_for(text)
    assert error.line_number == 6
    assert error.line == "bad line"
    assert error.path == "a"
    assert str(error).startswith("Invalid Line at line 6: 'bad line'")


def test_missing_path() -> None:
    error = error_for("*** Begin Patch\n*** Update File:   \n@@\n x\n*** End Patch\n")
    assert "Missing path at line 2" in str(error)


def test_end_patch_twice() -> None:
    error = error_for("*** Begin Patch\n*** Delete File: a\n*** End Patch\n*** End Patch\n")
    assert error.line_number == 3
    assert "only once" in str(error)


# --------------------------------------------------------------------------- JSON forms


def test_json_single_list_and_wrapped_forms() -> None:
    op = {"type": "update_file", "path": "a.py", "diff": "@@\n-x\n+y\n", "move_to": "b.py"}
    expected = [
        PatchOperation(type="update_file", path="a.py", diff="@@\n-x\n+y\n", move_to="b.py")
    ]
    assert parse_patch(json.dumps(op)) == expected
    assert parse_patch(json.dumps([op])) == expected
    assert parse_patch(json.dumps({"operation": op})) == expected
    assert parse_patch("  " + json.dumps({"operations": [op, op]})) == expected * 2


def test_json_delete_ignores_diff() -> None:
    (op,) = parse_patch('{"type": "delete_file", "path": "a", "diff": null}')
    assert op == PatchOperation(type="delete_file", path="a")


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        ({"type": "rename_file", "path": "a"}, "'type' to be one of"),
        ({"type": "delete_file", "path": ""}, "'path' to be a non-empty string"),
        ({"type": "create_file", "path": "a"}, "'diff' to be a non-empty string for create_file"),
        ({"type": "update_file", "path": "a", "diff": ""}, "'diff' to be a non-empty string"),
        ({"type": "update_file", "path": "a", "diff": "@@\n x\n", "move_to": ""}, "'move_to'"),
        ({"type": "create_file", "path": "a", "diff": "+x\n", "move_to": "b"}, "only on update"),
        ("not an object", "a JSON object"),
    ],
)
def test_json_validation(payload: object, fragment: str) -> None:
    with pytest.raises(InvalidOperationError) as info:
        operation_from_dict(payload, index=3)
    assert fragment in str(info.value)
    assert str(info.value).startswith("Invalid operation 3")


def test_json_diff_syntax_is_checked() -> None:
    with pytest.raises(InvalidAddFileLineError):
        operation_from_dict({"type": "create_file", "path": "a", "diff": "no plus\n"})


def test_invalid_json() -> None:
    with pytest.raises(PatchParseError, match="Invalid JSON patch"):
        parse_patch('{"type": ')
    with pytest.raises(InvalidOperationError, match="non-empty list"):
        parse_patch("[]")


# --------------------------------------------------------------------------- format_patch


def test_format_patch_round_trips() -> None:
    ops = parse_patch(FULL)
    assert parse_patch(format_patch(ops)) == ops
    assert format_patch(ops) == FULL
