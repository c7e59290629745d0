"""Dependencies the routes share: the caller's principal, the services, paging params."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Depends, Header, Query, Request

from shellbox.service.models import Principal
from shellbox.services import Services


def get_services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(get_services)]


def get_principal(
    services: ServicesDep,
    authorization: Annotated[str | None, Header(include_in_schema=False)] = None,
) -> Principal:
    return services.keys.authenticate(authorization)


PrincipalDep = Annotated[Principal, Depends(get_principal)]


@dataclass(frozen=True)
class Paging:
    after: str | None
    limit: int
    order: Literal["asc", "desc"]


def paging(
    after: Annotated[str | None, Query(description="id of the previous page's last item")] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    order: Annotated[Literal["asc", "desc"], Query()] = "desc",
) -> Paging:
    return Paging(after, limit, order)


PagingDep = Annotated[Paging, Depends(paging)]
