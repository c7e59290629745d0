"""Object ids: a type prefix and random hex, as the OpenAI API's ids look."""

from __future__ import annotations

import secrets


def new_id(prefix: str, nbytes: int = 12) -> str:
    return f"{prefix}{secrets.token_hex(nbytes)}"
