"""Stored responses, as the Responses API sees them: scoped to the caller's project, a 404
naming the parameter when one is missing (the rows are ``store.responses``')."""

from __future__ import annotations

from typing import Any

from shellbox.errors import ResponseNotFound
from shellbox.service.models import Principal
from shellbox.store import ResponseStore
from shellbox.store.metering import SandboxUsage
from shellbox.store.records import StoredResponse

__all__ = ["StoredResponse", "StoredResponses"]


class StoredResponses:
    def __init__(self, store: ResponseStore) -> None:
        self.store = store

    def save(
        self,
        principal: Principal,
        body: dict[str, Any],
        conversation: list[dict[str, Any]],
        container_id: str | None,
        usage: SandboxUsage | None = None,
    ) -> None:
        """Store a response; with ``usage``, its sandbox time too, in the same transaction."""
        self.store.save(principal.project, body, conversation, container_id, usage=usage)

    def get(self, principal: Principal, response_id: str, *, param: str) -> StoredResponse:
        found = self.store.get(principal.project, response_id)
        if found is None:
            msg = f"No response found with id '{response_id}'."
            raise ResponseNotFound(msg, param=param)
        return found

    def delete(self, principal: Principal, response_id: str) -> None:
        if not self.store.delete(principal.project, response_id):
            msg = f"No response found with id '{response_id}'."
            raise ResponseNotFound(msg, param="response_id")
