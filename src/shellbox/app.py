"""``create_app(settings)``: the FastAPI application; its lifespan owns every service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from shellbox import __version__, memory
from shellbox.agent.protocol import MAX_REQUEST_BYTES
from shellbox.api import errors, openapi
from shellbox.api.body_budget import BodyBudget, BodyBudgetMiddleware
from shellbox.api.console import routes as console
from shellbox.api.middleware import RequestContextMiddleware
from shellbox.api.port_gateway import PortGateway
from shellbox.api.routes import (
    containers,
    egress,
    files,
    messages,
    organization,
    ports,
    pty,
    responses,
    skills,
    snapshots,
    workspace,
)
from shellbox.services import Services, create_services
from shellbox.settings import Settings

ROUTERS = (
    containers.router,
    pty.router,
    snapshots.router,
    organization.router,
    files.router,
    workspace.router,
    skills.router,
    egress.router,
    ports.router,
    responses.router,
    messages.router,
)


def create_app(settings: Settings, services: Services | None = None) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        svc = services or create_services(settings)
        app.state.services = svc
        await svc.start()
        try:
            yield
        finally:
            await svc.close()

    app = FastAPI(
        title="shellbox",
        version=__version__,
        description="A self-hosted, OpenAI-compatible hosted shell.",
        lifespan=lifespan,
    )
    errors.install(app)
    memory.return_large_blocks_to_os()
    app.add_middleware(PortGateway)  # innermost: the request id and the upload cap still apply
    app.add_middleware(  # inside the request-context middleware: its answers get a request id
        BodyBudgetMiddleware,
        budget=BodyBudget(settings.limits.body_budget_bytes, settings.limits.body_budget_wait_s),
        max_json_bytes=MAX_REQUEST_BYTES,
    )
    openapi.install(app)
    app.add_middleware(
        RequestContextMiddleware,
        upload_max_bytes=settings.limits.upload_max_bytes,
        max_json_bytes=MAX_REQUEST_BYTES,
    )
    for router in ROUTERS:
        app.include_router(router)
    app.include_router(console.router)
    app.mount("/console/static", console.static, name="console-static")

    @app.get("/healthz", tags=["health"])
    async def healthz() -> JSONResponse:
        # The cgroup layout the sandboxes run on (v2, hybrid or v1) and the kind of disk quota
        # ("simple", "qgroup", or None: no quota): support questions start here.
        info = app.state.services.runtime.describe()
        return JSONResponse(
            {
                "status": "ok",
                "version": __version__,
                "cgroup": info.cgroup,
                "disk_quota": info.disk_quota,
            }
        )

    return app
