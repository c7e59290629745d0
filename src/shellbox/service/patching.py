"""``apply_patch_call`` items: V4A operations applied to a container's ``/mnt/data``.

The diff logic is the pure ``shellbox.patch`` library, and the files are the runtime's
(``Runtime.apply_patch``: all or nothing, with the sandbox user's permissions); this module
reads the call item, runs it, and shapes its output item.
"""

from __future__ import annotations

from typing import Any

from shellbox.errors import InvalidRequest
from shellbox.ids import new_id
from shellbox.patch import PatchError, PatchOperation, operation_from_dict, parse_patch
from shellbox.service.containers import ContainerService
from shellbox.service.files import FileService
from shellbox.service.models import Principal


def operations_from_item(item: dict[str, Any]) -> list[PatchOperation]:
    """The operations of an ``apply_patch_call``: ``operation``, ``operations`` (the Agents
    SDK's plural form) or a whole ``*** Begin Patch`` envelope in ``patch``/``input``."""
    try:
        if isinstance(item.get("operation"), dict):
            return [operation_from_dict(item["operation"])]
        if isinstance(item.get("operations"), list) and item["operations"]:
            return [
                operation_from_dict(op, index=i) for i, op in enumerate(item["operations"], start=1)
            ]
        for key in ("patch", "input"):
            if isinstance(item.get(key), str) and item[key].strip():
                return parse_patch(item[key])
    except PatchError as exc:
        raise InvalidRequest(str(exc), param="operation") from None
    msg = (
        "an apply_patch_call needs 'operation' ({type, path, diff}), 'operations' (a list of "
        "them) or 'patch' (a '*** Begin Patch' envelope)"
    )
    raise InvalidRequest(msg, param="operation")


def apply_patch_output(call_id: str, completed: bool, output: str) -> dict[str, Any]:
    return {
        "type": "apply_patch_call_output",
        "id": new_id("apo_"),
        "call_id": call_id,
        "status": "completed" if completed else "failed",
        "output": output,
    }


class PatchService:
    """Registered as the ``apply_patch_call`` handler of the calls endpoint."""

    def __init__(self, containers: ContainerService, files: FileService) -> None:
        self.containers = containers
        self.files = files

    async def apply_patch_call(
        self, principal: Principal, cid: str, item: dict[str, Any]
    ) -> dict[str, Any]:
        ops = operations_from_item(item)
        call_id = item.get("call_id") or item.get("id") or new_id("call_")
        async with self.containers.activity(principal, cid):
            result = await self.containers.runtime.apply_patch(cid, ops)
            await self.files.sync(cid)
        return apply_patch_output(str(call_id), result.completed, result.output)
