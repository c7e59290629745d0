"""``ResponsesService``: starts runs of the tool loop (resolving the previous response, the
upstream and the container first, so every client mistake is an HTTP error before a stream
begins), and keeps the stored responses."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from shellbox.errors import InvalidRequest
from shellbox.ids import new_id
from shellbox.responses.chat_dialect import ChatDialect
from shellbox.responses.environment import (
    compose_instructions,
    environment_note,
    resolve_container,
)
from shellbox.responses.items import check_pairing
from shellbox.responses.loop import Caps, LoopRequest, Run
from shellbox.responses.responses_dialect import ResponsesDialect
from shellbox.responses.store import StoredResponse, StoredResponses
from shellbox.responses.upstream import UpstreamClient, check_models, resolve_target
from shellbox.service.calls import CallService
from shellbox.service.containers import ContainerService
from shellbox.service.files import FileService
from shellbox.service.metering import MeteringService
from shellbox.service.models import Principal
from shellbox.settings import UpstreamSettings
from shellbox.store import ResponseStore
from shellbox.store.metering import UsageKind


class ResponsesService:
    def __init__(
        self,
        settings: UpstreamSettings,
        store: ResponseStore,
        containers: ContainerService,
        calls: CallService,
        files: FileService,
        metering: MeteringService,
    ) -> None:
        check_models(settings)
        self.settings = settings
        self.containers = containers
        self.calls = calls
        self.files = files
        self.store = StoredResponses(store)
        self.metering = metering
        self.upstream = UpstreamClient({"chat": ChatDialect(), "responses": ResponsesDialect()})
        self.caps = Caps(
            max_iterations=settings.max_iterations,
            max_sandbox_ns=int(settings.max_sandbox_s * 1e9),
            max_output_chars=settings.max_tool_output_chars,
        )

    async def close(self) -> None:
        await self.upstream.close()

    async def create_run(self, principal: Principal, req: LoopRequest, *, id_prefix: str) -> Run:
        target = resolve_target(self.settings, req.model)
        previous: StoredResponse | None = None
        if req.previous_response_id:
            previous = self.store.get(
                principal, req.previous_response_id, param="previous_response_id"
            )
        history = [*(previous.conversation if previous else []), *req.input_items]
        if not req.input_items and previous is None:
            msg = "input is required"
            raise InvalidRequest(msg, param="input")
        check_pairing(history)
        response_id = new_id(id_prefix)
        container = await resolve_container(
            self.containers,
            principal,
            req.tools,
            previous_container=previous.container_id if previous else None,
            name=response_id,
        )
        instructions = compose_instructions(
            req.instructions, environment_note(req.tools, container)
        )
        carried = container.id if container else (previous.container_id if previous else None)
        return Run(
            response_id=response_id,
            principal=principal,
            request=req,
            history=history,
            instructions=instructions,
            container=container,
            target=target,
            upstream=self.upstream,
            calls=self.calls,
            files=self.files,
            caps=self.caps,
            on_finish=self._finisher(principal, history, carried, req.store),
            on_call=self.metering.metrics.observe_call,
        )

    def _finisher(
        self,
        principal: Principal,
        history: list[dict[str, Any]],
        container_id: str | None,
        store: bool,
    ) -> Callable[[Run], None]:
        """What completes a run: its stored response and its sandbox time, in one transaction
        (see ``service.metering``)."""

        def finish(run: Run) -> None:
            usage = None
            if run.container is not None:
                kind: UsageKind = "messages" if run.id.startswith("msg_") else "responses"
                usage = self.metering.usage_of(run.id, principal, run.container.id, kind, run.clock)
            if store:
                conversation = [*history, *run.output]
                self.store.save(principal, run.response(), conversation, container_id, usage)
            else:
                self.metering.bill(usage)

        return finish

    def get(self, principal: Principal, response_id: str) -> dict[str, Any]:
        return self.store.get(principal, response_id, param="response_id").body

    def delete(self, principal: Principal, response_id: str) -> None:
        self.store.delete(principal, response_id)
