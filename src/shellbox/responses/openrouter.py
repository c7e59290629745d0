"""OpenRouter's shapes for the hosted shell (the ``openrouter:shell`` server tool).

Inside, a run keeps native items (a ``shell_call`` and its ``shell_call_output``): that is what
the model is shown and what a stored conversation holds. This module only changes what the
client sees when it asked for ``openrouter:shell``:

- **Responses**: each call and its output are one ``openrouter:shell`` item::

      {"type": "openrouter:shell", "id", "call_id", "status", "action": {commands,
       timeout_ms, max_output_length}, "output": [{stdout, stderr, outcome}, ...],
       "max_output_length", "container_id", "files": [<container_file_citation>, ...]}

  (the page shows ``output``, ``container_id`` and ``files``; the rest mirrors the native
  ``shell_call`` and ``shell_call_output`` items). Streamed, the item goes through the native
  shell item's events at one ``output_index``: ``output_item.added``, the
  ``shell_call_command.*`` events, the ``shell_call_output_content.*`` events, then
  ``output_item.done`` with the whole item.
- **Messages**: see ``responses.messages`` (``server_tool_use`` named ``openrouter:shell``,
  then an ``openrouter_shell_tool_result`` block).

Sent back as ``input``, an ``openrouter:shell`` item is read as the native pair again.
"""

from __future__ import annotations

import copy
from collections.abc import AsyncGenerator
from typing import Any

from shellbox.responses.events import Event

ITEM_TYPE = "openrouter:shell"
CALL_FIELDS = ("id", "call_id", "action")


def merged(call: dict[str, Any], out: dict[str, Any] | None, cid: str | None) -> dict[str, Any]:
    """The ``openrouter:shell`` item for a shell call and its output (None: still running)."""
    action = call.get("action") or {}
    item: dict[str, Any] = {
        "type": ITEM_TYPE,
        "id": item_id(call),
        "call_id": call["call_id"],
        "status": "in_progress" if out is None else _status(out),
        "action": {k: action.get(k) for k in ("commands", "timeout_ms", "max_output_length")},
        "output": [] if out is None else list(out.get("output") or []),
        "max_output_length": (out or {}).get("max_output_length"),
        "container_id": cid,
        "files": [] if out is None else list(out.get("files") or []),
    }
    return item


def item_id(call: dict[str, Any]) -> str:
    """The merged item's id: the call's (an upstream may send calls without one: then one made
    from the call_id, so the item keeps it from its first event to the stored response)."""
    return str(call.get("id") or f"sh_{call['call_id']}")


def _status(out: dict[str, Any]) -> str:
    return "completed" if out.get("status", "completed") == "completed" else "incomplete"


def present_output(output: list[dict[str, Any]], cid: str | None) -> list[dict[str, Any]]:
    """A response's output as the client sees it: each shell call, with its output when it has
    one, made one ``openrouter:shell`` item at the call's place."""
    outputs = {i["call_id"]: i for i in output if i.get("type") == "shell_call_output"}
    shown = []
    for item in output:
        kind = item.get("type")
        if kind == "shell_call":
            shown.append(merged(item, outputs.get(item["call_id"]), cid))
        elif kind == "shell_call_output" and _has_call(output, item["call_id"]):
            continue
        else:
            shown.append(item)
    return shown


def _has_call(output: list[dict[str, Any]], call_id: str) -> bool:
    return any(i.get("type") == "shell_call" and i["call_id"] == call_id for i in output)


def expand_input(item: dict[str, Any]) -> list[dict[str, Any]]:
    """An ``openrouter:shell`` item sent back as input: the native call, and its output when
    the item has one (an item still in progress has none)."""
    call = {
        "type": "shell_call",
        "call_id": item.get("call_id") or item.get("id"),
        "action": item.get("action"),
        "status": "completed",
    }
    if item.get("id"):
        call["id"] = item["id"]
    if item.get("status") == "in_progress":
        return [call]
    out = {
        "type": "shell_call_output",
        "call_id": call["call_id"],
        "output": item.get("output"),
        "max_output_length": item.get("max_output_length"),
    }
    return [call, out]


class EventMapper:
    """Turns a run's native stream into OpenRouter's: a shell call and its output share one
    ``output_index`` (the call's place), events the merged item does not have are dropped,
    and ``sequence_number`` counts the events that are sent."""

    def __init__(self, cid: str | None) -> None:
        self.cid = cid
        self.index: dict[int, int] = {}  # native output_index -> the client's
        self.calls: dict[str, dict[str, Any]] = {}  # call_id -> the native call
        self.by_call: dict[str, int] = {}  # call_id -> the client's output_index
        self.next_index = 0
        self.seq = 0

    def _event(self, event: Event, **changes: Any) -> Event:
        out = {**event, **changes, "sequence_number": self.seq}
        self.seq += 1
        return out

    def _place(self, native: int) -> int:
        if native not in self.index:
            self.index[native] = self.next_index
            self.next_index += 1
        return self.index[native]

    def map(self, event: Event) -> list[Event]:
        kind = event["type"]
        if "output_index" not in event:
            return [self._event(event)]  # lifecycle events: their snapshots are presented
        native = event["output_index"]
        item = event.get("item") or {}
        if kind == "response.output_item.added" and item.get("type") == "shell_call":
            index = self._place(native)
            self.by_call[item["call_id"]] = index
            self.calls[item["call_id"]] = item
            first = merged(item, None, self.cid)
            return [self._event(event, output_index=index, item=first)]
        if kind == "response.output_item.done" and item.get("type") == "shell_call":
            self.calls[item["call_id"]] = copy.deepcopy(item)
            return []
        if item.get("type") == "shell_call_output" and item.get("call_id") in self.by_call:
            index = self.by_call[item["call_id"]]
            self.index[native] = index
            if kind == "response.output_item.added":
                return []
            call = self.calls[item["call_id"]]
            return [self._event(event, output_index=index, item=merged(call, item, self.cid))]
        index = self._place(native)
        if kind.startswith("response.shell_call_output_content."):
            call_id = next((c for c, i in self.by_call.items() if i == index), None)
            owner = self.calls.get(call_id or "")
            if owner is not None:
                return [self._event(event, output_index=index, item_id=item_id(owner))]
        return [self._event(event, output_index=index)]

    async def events(self, native: AsyncGenerator[Event, None]) -> AsyncGenerator[Event, None]:
        try:
            async for event in native:
                for out in self.map(event):
                    yield out
        finally:
            await native.aclose()  # a client that left: the running command is killed
