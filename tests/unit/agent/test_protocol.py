"""Output capture rules (``shellbox.agent.protocol``): truncation and the streaming capture."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from shellbox.agent.protocol import TAIL_PIECES, Capture, truncate_text, truncation_marker

MARKER = re.compile(r"\n\[\.\.\. (\d+) characters truncated \.\.\.\]\n")
texts = st.text(alphabet=st.characters(blacklist_categories=["Cs"]), max_size=400)


def check_truncated(original: str, out: str, cap: int) -> None:
    assert len(out) <= cap
    if len(original) <= cap:
        assert out == original
        return
    m = MARKER.search(out)
    if m is None:  # a cap too small for the marker keeps the head only
        assert cap < len(truncation_marker(len(original)))
        assert out == original[:cap]
        return
    head, tail = out[: m.start()], out[m.end() :]
    assert len(out) == cap
    assert original.startswith(head)
    assert original.endswith(tail)
    assert len(head) + int(m.group(1)) + len(tail) == len(original)
    assert abs(len(head) - len(tail)) <= 1


@given(texts, st.integers(min_value=0, max_value=450))
def test_truncate_text_keeps_head_tail_and_an_exact_marker(text: str, cap: int) -> None:
    check_truncated(text, truncate_text(text, cap), cap)


def test_marker_length_changes_are_handled() -> None:
    # Around the point where the omitted count gains a digit, the marker must still be exact.
    for total in range(60, 200):
        for cap in range(30, 60):
            text = "".join(chr(0x61 + i % 26) for i in range(total))
            check_truncated(text, truncate_text(text, cap), cap)


def test_truncation_example() -> None:
    text = "é" * 50 + "字" * 50
    out = truncate_text(text, 45)
    assert out == "é" * 5 + "\n[... 90 characters truncated ...]\n" + "字" * 5
    assert len(out) == 45


@settings(max_examples=200)
@given(texts, st.integers(min_value=0, max_value=300), st.data())
def test_capture_in_any_chunks_equals_truncating_the_whole(
    text: str, cap: int, data: st.DataObject
) -> None:
    raw = text.encode()
    cuts = sorted(data.draw(st.lists(st.integers(0, len(raw)), max_size=20)))
    capture = Capture(cap)
    fresh = []
    for a, b in zip([0, *cuts], [*cuts, len(raw)], strict=True):
        fresh.append(capture.feed(raw[a:b]))
    fresh.append(capture.feed(b"", final=True))
    assert capture.total == len(text)
    assert capture.result() == truncate_text(text, cap)
    assert "".join(fresh) == text[:cap]  # the streamed deltas are the head


@given(st.binary(max_size=300), st.integers(min_value=0, max_value=200))
def test_invalid_utf8_becomes_replacement_characters(raw: bytes, cap: int) -> None:
    capture = Capture(cap)
    for i in range(0, len(raw), 3):
        capture.feed(raw[i : i + 3])
    capture.feed(b"", final=True)
    whole = raw.decode("utf-8", "replace")
    assert capture.result() == truncate_text(whole, cap)


def test_capture_memory_is_bounded_by_the_cap() -> None:
    cap = 1000
    capture = Capture(cap)
    chunk = ("abcdefghij" * 6553).encode()  # ~64 KiB, one pipe read
    for _ in range(2000):  # ~130 MB through the capture
        capture.feed(chunk)
        assert capture._head_len <= cap
        assert capture._tail_len < cap + len(chunk)
        assert len(capture._tail) <= 2
    small = b"x"
    for _ in range(5000):  # many tiny reads: the tail queue stays short too
        capture.feed(small)
        assert capture._tail_len < cap + len(chunk)
        assert len(capture._tail) <= TAIL_PIECES + 1
    out = capture.result()
    assert len(out) == cap
    assert out.endswith("x" * (cap // 2 - 40))
