"""``create_app(settings)``: the FastAPI application; its lifespan owns every service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from shellbox import __version__
from shellbox.agent.protocol import MAX_REQUEST_BYTES
from shellbox.api import errors, openapi
from shellbox.api.middleware import RequestContextMiddleware
from shellbox.api.routes import (
    containers,
    egress,
    files,
    messages,
    responses,
    skills,
    workspace,
)
from shellbox.services import Services, create_services
from shellbox.settings import Settings

ROUTERS = (
    containers.router,
    files.router,
    workspace.router,
    skills.router,
    egress.router,
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
    openapi.install(app)
    app.add_middleware(
        RequestContextMiddleware,
        upload_max_bytes=settings.limits.upload_max_bytes,
        max_json_bytes=MAX_REQUEST_BYTES,
    )
    for router in ROUTERS:
        app.include_router(router)

    @app.get("/healthz", tags=["health"])
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok", "version": __version__})

    return app
