"""Responses API streaming events: numbering them, the series each kind of output item goes
through, and the SSE encoding.

The series are the ones the official SDK's stream accumulator expects: an item is announced
by ``response.output_item.added`` (in progress, empty) and finished by
``response.output_item.done`` (whole); a message's text arrives through
``content_part.added`` / ``output_text.delta`` / ``output_text.done`` / ``content_part.done``;
a shell call's commands through ``shell_call_command.added/delta/done`` (tied to the item
by ``output_index`` only, as the SDK does).
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


def message_events(emit: Emitter, index: int, item: dict[str, Any]) -> Iterator[Event]:
    first = _in_progress(item)
    first["content"] = []
    yield emit("response.output_item.added", output_index=index, item=first)
    for c, part in enumerate(item.get("content", [])):
        if part.get("type") != "output_text":
            yield emit(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=c,
                part=part,
            )
        else:
            text = part.get("text", "")
            empty = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            yield emit(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=c,
                part=empty,
            )
            if text:
                yield emit(
                    "response.output_text.delta",
                    item_id=item["id"],
                    output_index=index,
                    content_index=c,
                    delta=text,
                    logprobs=[],
                )
            for a, annotation in enumerate(part.get("annotations") or []):
                yield emit(
                    "response.output_text.annotation.added",
                    item_id=item["id"],
                    output_index=index,
                    content_index=c,
                    annotation_index=a,
                    annotation=annotation,
                )
            yield emit(
                "response.output_text.done",
                item_id=item["id"],
                output_index=index,
                content_index=c,
                text=text,
                logprobs=[],
            )
        yield emit(
            "response.content_part.done",
            item_id=item["id"],
            output_index=index,
            content_index=c,
            part=part,
        )
    yield emit("response.output_item.done", output_index=index, item=item)


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
