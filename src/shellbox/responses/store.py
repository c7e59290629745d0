"""Stored responses: what ``GET /v1/responses/{id}`` returns and what ``previous_response_id``
continues from (the whole conversation so far, and the container the shell ran in)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, BigInteger, Column, Integer, String, Table, delete, insert, select
from sqlalchemy.engine import Connection

from shellbox.errors import ResponseNotFound
from shellbox.service.models import Principal
from shellbox.store import Database
from shellbox.store.tables import metadata

responses = Table(
    "responses",
    metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("id", String(64), unique=True, nullable=False),
    Column("project", String(128), nullable=False, index=True),
    Column("created_at", BigInteger, nullable=False),
    Column("status", String(16), nullable=False),
    Column("container_id", String(64), nullable=True),
    Column("body", JSON, nullable=False),  # the Response object, as the API shows it
    # Input and output items of the whole chain up to this response (instructions and tools
    # are not carried over, as in the OpenAI API).
    Column("conversation", JSON, nullable=False),
)


@dataclass(frozen=True)
class StoredResponse:
    id: str
    container_id: str | None
    body: dict[str, Any]
    conversation: list[dict[str, Any]]


class ResponseStore:
    def __init__(self, db: Database) -> None:
        self.db = db
        # The feature is installed after the database is opened (and its create_all ran).
        responses.create(db.engine, checkfirst=True)

    def save(
        self,
        principal: Principal,
        body: dict[str, Any],
        conversation: list[dict[str, Any]],
        container_id: str | None,
        conn: Connection | None = None,
    ) -> None:
        """Store a response; in the caller's transaction when given ``conn`` (the one that
        also bills its sandbox time)."""
        if conn is None:
            with self.db.begin() as own:
                self.save(principal, body, conversation, container_id, own)
            return
        conn.execute(
            insert(responses).values(
                id=body["id"],
                project=principal.project,
                created_at=int(body["created_at"]),
                status=body["status"],
                container_id=container_id,
                body=body,
                conversation=conversation,
            )
        )

    def get(self, principal: Principal, response_id: str, *, param: str) -> StoredResponse:
        with self.db.connect() as conn:
            row = conn.execute(
                select(
                    responses.c.id,
                    responses.c.container_id,
                    responses.c.body,
                    responses.c.conversation,
                ).where(responses.c.id == response_id, responses.c.project == principal.project)
            ).first()
        if row is None:
            msg = f"No response found with id '{response_id}'."
            raise ResponseNotFound(msg, param=param)
        return StoredResponse(row.id, row.container_id, row.body, row.conversation)

    def delete(self, principal: Principal, response_id: str) -> None:
        with self.db.begin() as conn:
            result = conn.execute(
                delete(responses).where(
                    responses.c.id == response_id, responses.c.project == principal.project
                )
            )
        if result.rowcount == 0:
            msg = f"No response found with id '{response_id}'."
            raise ResponseNotFound(msg, param="response_id")
