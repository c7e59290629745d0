"""``ShellboxContainer``: the one container that the shell executors and the editor share."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Literal

import openai

from shellbox.client import AsyncShellbox

log = logging.getLogger("shellbox.integrations.agents")

MemoryLimit = Literal["1g", "4g", "16g", "64g"]


class ShellboxContainer:
    """A shellbox container for Agents SDK tools: an existing one (``container_id``) or one
    created on first use with the given settings.

    Pass the same object to ``ShellboxShellExecutor``, ``ShellboxLocalShellExecutor`` and
    ``ShellboxEditor`` so the model's commands and patches work on the same files. ``aclose()``
    (or ``async with``) deletes the container if this object created it.
    """

    def __init__(
        self,
        client: AsyncShellbox | None = None,
        *,
        container_id: str | None = None,
        name: str = "agents",
        memory_limit: MemoryLimit | None = None,
        expires_after_minutes: int | None = None,
        network_policy: dict[str, Any] | None = None,
        skills: list[dict[str, Any]] | None = None,
        file_ids: list[str] | None = None,
        base_url: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.client = client or AsyncShellbox(base_url, api_key)
        self._owns_client = client is None
        self._container_id = container_id
        self._created = False
        self._create_args: dict[str, Any] = {"name": name}
        if memory_limit is not None:
            self._create_args["memory_limit"] = memory_limit
        if expires_after_minutes is not None:
            self._create_args["expires_after"] = {
                "anchor": "last_active_at",
                "minutes": expires_after_minutes,
            }
        if network_policy is not None:
            self._create_args["network_policy"] = network_policy
        if skills is not None:
            self._create_args["skills"] = skills
        if file_ids is not None:
            self._create_args["file_ids"] = file_ids
        self._lock: asyncio.Lock | None = None

    @property
    def container_id(self) -> str | None:
        """The container's id, or None while it has not been created yet."""
        return self._container_id

    async def id(self) -> str:
        """The container's id, creating the container on first use."""
        if self._container_id is not None:
            return self._container_id
        if self._lock is None:  # made here so it binds to the loop that uses it
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._container_id is None:
                container = await self.client.openai.containers.create(**self._create_args)
                self._container_id = container.id
                self._created = True
        return self._container_id

    async def aclose(self) -> None:
        """Delete the container if it was created here; close the client if it was made here."""
        try:
            if self._created and self._container_id is not None:
                # Already gone (deleted elsewhere, or expired and reaped) is fine.
                with contextlib.suppress(openai.NotFoundError):
                    await self.client.openai.containers.delete(self._container_id)
                self._created = False
        finally:
            if self._owns_client:
                await self.client.aclose()

    async def __aenter__(self) -> ShellboxContainer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
