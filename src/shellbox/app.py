"""``create_app(settings)``: the FastAPI application; its lifespan owns every service."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from shellbox import __version__
from shellbox.agent.protocol import MAX_REQUEST_BYTES
from shellbox.api import errors
from shellbox.api.middleware import RequestContextMiddleware
from shellbox.api.routes import containers, files
from shellbox.services import Services, create_services
from shellbox.settings import Settings

# Routers of optional features register themselves here (see services.FEATURES).
EXTRA_ROUTERS: list[object] = []


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
    app.add_middleware(
        RequestContextMiddleware,
        upload_max_bytes=settings.limits.upload_max_bytes,
        max_json_bytes=MAX_REQUEST_BYTES,
    )
    app.include_router(containers.router)
    app.include_router(files.router)
    for router in EXTRA_ROUTERS:
        app.include_router(router)  # type: ignore[arg-type]

    @app.get("/healthz", tags=["health"])
    async def healthz() -> JSONResponse:
        return JSONResponse({"status": "ok", "version": __version__})

    return app


from shellbox.api.routes import workspace as _workspace_routes  # noqa: E402

EXTRA_ROUTERS.append(_workspace_routes.router)

from shellbox.api.routes import skills as _skills_routes  # noqa: E402

EXTRA_ROUTERS.append(_skills_routes.router)

from shellbox.api.routes import egress as _egress_routes  # noqa: E402

EXTRA_ROUTERS.append(_egress_routes.router)

from shellbox.api.routes import messages as _messages_routes  # noqa: E402
from shellbox.api.routes import responses as _responses_routes  # noqa: E402

EXTRA_ROUTERS += [_responses_routes.router, _messages_routes.router]
