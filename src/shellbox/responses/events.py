"""Responses API streaming events: numbering them, the series each kind of output item goes
through, and the SSE encoding.

The series are the ones the official SDK's stream accumulator expects: an item is announced
by ``response.output_item.added`` (in progress, empty) and finished by
``response.output_item.done`` (whole); a message's text arrives through
``content_part.added`` / ``output_text.delta`` / ``output_text.done`` / ``content_part.done``;
a shell call's commands through ``shell_call_command.added/delta/done`` (tied to the item
by ``output_index`` only, as the SDK does). A ``LiveMessage`` goes through the same series
as a whole message, with its text in as many deltas as the model wrote it in.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from typing import Any

Event = dict[str, Any]


class Emitter:
    """Numbers events: ``sequence_number`` starts at 0 and increases by one."""

    def __init__(self) -> None:
        self.next = 0

    def __call__(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, "sequence_number": self.next, **fields}
        self.next += 1
        return event


def sse(event: Event) -> bytes:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def _in_progress(item: dict[str, Any]) -> dict[str, Any]:
    first = copy.deepcopy(item)
    if "status" in first:
        first["status"] = "in_progress"
    return first


def _text_part_end(
    emit: Emitter, item_id: str, index: int, c: int, part: dict[str, Any]
) -> Iterator[Event]:
    """What follows a text part's deltas: its annotations, then its whole text."""
    for a, annotation in enumerate(part.get("annotations") or []):
        yield emit(
            "response.output_text.annotation.added",
            item_id=item_id,
            output_index=index,
            content_index=c,
            annotation_index=a,
            annotation=annotation,
        )
    yield emit(
        "response.output_text.done",
        item_id=item_id,
        output_index=index,
        content_index=c,
        text=part.get("text", ""),
        logprobs=[],
    )
    yield _part_done(emit, item_id, index, c, part)


def _text_delta(emit: Emitter, item_id: str, index: int, c: int, text: str) -> Event:
    return emit(
        "response.output_text.delta",
        item_id=item_id,
        output_index=index,
        content_index=c,
        delta=text,
        logprobs=[],
    )


def _part_added(emit: Emitter, item_id: str, index: int, c: int, part: dict[str, Any]) -> Event:
    return emit(
        "response.content_part.added",
        item_id=item_id,
        output_index=index,
        content_index=c,
        part=part,
    )


def _part_done(emit: Emitter, item_id: str, index: int, c: int, part: dict[str, Any]) -> Event:
    return emit(
        "response.content_part.done",
        item_id=item_id,
        output_index=index,
        content_index=c,
        part=part,
    )


def _empty_text() -> dict[str, Any]:
    return {"type": "output_text", "text": "", "annotations": [], "logprobs": []}


def _part_events(
    emit: Emitter, item_id: str, index: int, c: int, part: dict[str, Any]
) -> Iterator[Event]:
    """The whole series of a content part that is complete when it is emitted."""
    if part.get("type") != "output_text":
        yield _part_added(emit, item_id, index, c, part)
        yield _part_done(emit, item_id, index, c, part)
        return
    yield _part_added(emit, item_id, index, c, _empty_text())
    if part.get("text"):
        yield _text_delta(emit, item_id, index, c, part["text"])
    yield from _text_part_end(emit, item_id, index, c, part)


def message_events(emit: Emitter, index: int, item: dict[str, Any]) -> Iterator[Event]:
    first = _in_progress(item)
    first["content"] = []
    yield emit("response.output_item.added", output_index=index, item=first)
    for c, part in enumerate(item.get("content", [])):
        yield from _part_events(emit, item["id"], index, c, part)
    yield emit("response.output_item.done", output_index=index, item=item)


class LiveMessage:
    """A message shown while the model writes it: announced by its first text, its text
    parts opened in order as their deltas come, and finished by ``close`` with the turn's
    final item (the same series ``message_events`` gives, with the text in pieces).

    ``item`` is the message so far, which is what a response snapshot shows of it.
    """

    def __init__(self, index: int, item_id: str) -> None:
        self.index = index
        self.item: dict[str, Any] = {
            "type": "message",
            "id": item_id,
            "role": "assistant",
            "status": "in_progress",
            "content": [],
        }

    @property
    def id(self) -> str:
        return str(self.item["id"])

    def open(self, emit: Emitter) -> Iterator[Event]:
        yield emit(
            "response.output_item.added", output_index=self.index, item=copy.deepcopy(self.item)
        )

    def delta(self, emit: Emitter, c: int, text: str) -> Iterator[Event]:
        parts: list[dict[str, Any]] = self.item["content"]
        if c == len(parts):
            parts.append(_empty_text())
            yield _part_added(emit, self.id, self.index, c, _empty_text())
        if c >= len(parts) or not text:
            return  # a part after one not shown yet: it comes whole with the final item
        parts[c]["text"] += text
        yield _text_delta(emit, self.id, self.index, c, text)

    def close(self, emit: Emitter, item: dict[str, Any]) -> Iterator[Event]:
        opened = len(self.item["content"])
        for c, part in enumerate(item.get("content", [])):
            if c < opened:
                yield from _text_part_end(emit, self.id, self.index, c, part)
            else:
                yield from _part_events(emit, self.id, self.index, c, part)
        yield emit("response.output_item.done", output_index=self.index, item=item)


def shell_call_events(emit: Emitter, index: int, item: dict[str, Any]) -> Iterator[Event]:
    first = _in_progress(item)
    first["action"] = {**item["action"], "commands": []}
    yield emit("response.output_item.added", output_index=index, item=first)
    for c, command in enumerate(item["action"]["commands"]):
        yield emit(
            "response.shell_call_command.added", output_index=index, command_index=c, command=""
        )
        if command:
            yield emit(
                "response.shell_call_command.delta",
                output_index=index,
                command_index=c,
                delta=command,
            )
        yield emit(
            "response.shell_call_command.done", output_index=index, command_index=c, command=command
        )
    yield emit("response.output_item.done", output_index=index, item=item)


def function_call_events(emit: Emitter, index: int, item: dict[str, Any]) -> Iterator[Event]:
    first = _in_progress(item)
    first["arguments"] = ""
    yield emit("response.output_item.added", output_index=index, item=first)
    if item["arguments"]:
        yield emit(
            "response.function_call_arguments.delta",
            item_id=item["id"],
            output_index=index,
            delta=item["arguments"],
        )
    yield emit(
        "response.function_call_arguments.done",
        item_id=item["id"],
        output_index=index,
        name=item["name"],
        arguments=item["arguments"],
    )
    yield emit("response.output_item.done", output_index=index, item=item)


def item_events(emit: Emitter, index: int, item: dict[str, Any]) -> Iterator[Event]:
    """The whole series for an item that is complete when it is emitted."""
    kind = item.get("type")
    if kind == "message":
        yield from message_events(emit, index, item)
    elif kind == "shell_call":
        yield from shell_call_events(emit, index, item)
    elif kind == "function_call":
        yield from function_call_events(emit, index, item)
    else:
        yield emit("response.output_item.added", output_index=index, item=_in_progress(item))
        yield emit("response.output_item.done", output_index=index, item=item)
