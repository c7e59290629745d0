"""One check for every string (and number) of a request, made before any route code runs.

JSON can spell a lone UTF-16 surrogate (``"\\ud800"``) and Python's ``json`` accepts it; no
UTF-8 encoder does, so such a string reached the database, the agent or the upstream model
and failed there as a 500, sometimes after the command had run. NUL bytes fail the same way
(argv, env and paths are C strings; PostgreSQL's text refuses them). Both are refused here as
a 400 whose ``param`` is the field's path (``action.commands[0]``), for every JSON body, query
and path parameter and multipart field. Raw-body routes (workspace file and archive uploads)
carry bytes, not strings, and only their parameters are checked.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import Request
from starlette.datastructures import FormData, UploadFile

from shellbox.errors import InvalidRequest


def _problem(s: str) -> str | None:
    # Cheap first: ``in`` is a memchr, ``isascii`` a flag; only non-ASCII text is encoded
    # (about 3 ms per MiB here, where a regex over every string took 10 ms per MiB).
    nul = s.find("\x00")
    if nul >= 0:
        return f"contains a NUL byte (\\u0000) at character {nul}; remove it"
    if s.isascii():
        return None
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:  # json joins valid pairs: what is left is a lone one
        return (
            f"contains a lone UTF-16 surrogate (\\u{ord(s[exc.start]):04x}) at character "
            f"{exc.start}, which is not valid Unicode; send valid UTF-8 text"
        )
    return None


def _join(path: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def check_value(value: Any, param: str = "") -> None:
    """Raise ``InvalidRequest`` naming the first string (or object key) under ``value`` that
    holds a NUL byte or a lone surrogate. Iterative, so no nesting depth can overflow it."""
    stack: list[tuple[Any, str]] = [(value, param)]
    while stack:
        item, path = stack.pop()
        if isinstance(item, str):
            problem = _problem(item)
            if problem is not None:
                what = path or "the request body"
                msg = f"{what} {problem}"
                raise InvalidRequest(msg, param=path or None)
        elif isinstance(item, dict):
            for key, sub in reversed(list(item.items())):
                if isinstance(key, str) and (problem := _problem(key)) is not None:
                    msg = f"a key of {path or 'the request body'} {problem}"
                    raise InvalidRequest(msg, param=path or None)
                stack.append((sub, _join(path, str(key))))
        elif isinstance(item, list):
            stack.extend((sub, _join(path, i)) for i, sub in reversed(list(enumerate(item))))
        elif isinstance(item, float) and not math.isfinite(item):
            # Python's json reads NaN, Infinity and 1e400; JSON has no such numbers, and
            # echoing one back (a response object) would fail to serialise.
            what = path or "the request body"
            msg = f"{what} is {item}, which JSON cannot hold; send a finite number"
            raise InvalidRequest(msg, param=path or None)


def check_form(form: FormData) -> None:
    """The multipart fields' values and the uploads' file names."""
    for key, value in form.multi_items():
        check_value(key, key)
        if isinstance(value, UploadFile):
            check_value(value.filename or "", key)
        else:
            check_value(value, key)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or media.endswith("+json")


async def checked_params(request: Request) -> None:
    """Dependency for every route: its path and query parameters."""
    for name, value in request.path_params.items():
        check_value(value, name)
    for name, value in request.query_params.multi_items():
        check_value(value, name)


async def checked_request(request: Request) -> None:
    """Dependency for routes whose body is JSON: parameters, then every string of the body.
    The parsed body is the one FastAPI already parsed (``Request.json`` caches it)."""
    await checked_params(request)
    if not _is_json(request.headers.get("content-type", "application/json")):
        return
    if not await request.body():
        return
    try:
        body = await request.json()
    except ValueError:
        return  # not JSON: the route's own parsing answers the 400
    check_value(body)
