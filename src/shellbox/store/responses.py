"""Stored responses: what ``GET /v1/responses/{id}`` returns and what ``previous_response_id``
continues from (the whole conversation so far, and the container the shell ran in)."""

from __future__ import annotations

from typing import Any, Protocol

from sqlalchemy import delete, insert, select

from shellbox.store.db import Database
from shellbox.store.metering import SandboxUsage, insert_usage
from shellbox.store.records import StoredResponse
from shellbox.store.tables import responses


class ResponseStore(Protocol):
    def save(
        self,
        project: str,
        body: dict[str, Any],
        conversation: list[dict[str, Any]],
        container_id: str | None,
        *,
        usage: SandboxUsage | None = None,
    ) -> None:
        """Store a response; with ``usage``, the sandbox time it bills, in the same
        transaction (a crash leaves both or neither)."""
        ...

    def get(self, project: str, response_id: str) -> StoredResponse | None: ...
    def delete(self, project: str, response_id: str) -> bool: ...


class SqlResponseStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    def save(
        self,
        project: str,
        body: dict[str, Any],
        conversation: list[dict[str, Any]],
        container_id: str | None,
        *,
        usage: SandboxUsage | None = None,
    ) -> None:
        with self.db.begin() as conn:
            conn.execute(
                insert(responses).values(
                    id=body["id"],
                    project=project,
                    created_at=int(body["created_at"]),
                    status=body["status"],
                    container_id=container_id,
                    body=body,
                    conversation=conversation,
                )
            )
            if usage is not None:
                insert_usage(conn, usage)

    def get(self, project: str, response_id: str) -> StoredResponse | None:
        with self.db.connect() as conn:
            row = conn.execute(
                select(
                    responses.c.id,
                    responses.c.container_id,
                    responses.c.body,
                    responses.c.conversation,
                ).where(responses.c.id == response_id, responses.c.project == project)
            ).first()
        if row is None:
            return None
        return StoredResponse(row.id, row.container_id, row.body, row.conversation)

    def delete(self, project: str, response_id: str) -> bool:
        with self.db.begin() as conn:
            result = conn.execute(
                delete(responses).where(
                    responses.c.id == response_id, responses.c.project == project
                )
            )
        return bool(result.rowcount)
