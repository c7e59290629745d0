"""The server-side shell tool loop behind ``POST /v1/responses`` and ``POST /v1/messages``:
any model behind an OpenAI-compatible endpoint gets a hosted shell.

``install(services)`` (listed in ``services.FEATURES``) adds the ``ResponsesService`` as
``services.extras["responses"]``; the routes are in ``api/routes/responses.py`` and
``api/routes/messages.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from shellbox.services import Services


def install(services: Services) -> None:
    from shellbox.responses.service import ResponsesService

    service = ResponsesService(services)
    services.extras["responses"] = service
    services.closers.append(service.close)
