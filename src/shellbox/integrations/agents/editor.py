"""``ShellboxEditor``: the Agents SDK's ``ApplyPatchEditor`` backed by a container's
``apply_patch_call`` endpoint, so V4A diffs are applied to ``/mnt/data`` by the server."""

from __future__ import annotations

from typing import Any

from agents.editor import ApplyPatchEditor, ApplyPatchOperation, ApplyPatchResult

from shellbox.integrations.agents.container import ShellboxContainer


class ApplyPatchFailed(RuntimeError):
    """The server could not apply an operation; the message is its explanation for the model.

    Raising (rather than returning a failed result) is what the SDK's own workspace editor
    does: the runner then reports the call as ``failed`` with this text and stops applying
    the call's remaining operations, which may depend on the failed one.
    """


class ShellboxEditor(ApplyPatchEditor):
    """``ApplyPatchTool(editor=ShellboxEditor(container))``: create, update and delete files
    in the container's ``/mnt/data`` (paths are relative to it)."""

    def __init__(self, container: ShellboxContainer | None = None) -> None:
        self.container = container or ShellboxContainer()

    async def create_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        return await self._apply(operation)

    async def update_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        return await self._apply(operation)

    async def delete_file(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        return await self._apply(operation)

    async def _apply(self, operation: ApplyPatchOperation) -> ApplyPatchResult:
        wire: dict[str, Any] = {"type": operation.type, "path": operation.path}
        if operation.diff is not None:
            wire["diff"] = operation.diff
        if operation.move_to is not None:
            wire["move_to"] = operation.move_to
        cid = await self.container.id()
        out = await self.container.client.calls.apply_patch(cid, wire)
        if out.status == "failed":
            raise ApplyPatchFailed(out.output or f"{operation.type} {operation.path} failed")
        return ApplyPatchResult(status="completed", output=out.output or None)
