"""Signed tokens: what verifies, and what is refused with which code."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from shellbox.errors import ErrorCode, LinkRefused, SandboxError
from shellbox.service.signing import Signer, load_key

KEY = bytes(range(32))


def test_a_token_verifies_for_its_purpose_until_it_expires() -> None:
    now = [1000.0]
    signer = Signer(KEY, clock=lambda: now[0])
    token = signer.sign("port", {"c": "cntr_1", "o": 8000}, expires_at=1060)
    claims = signer.verify("port", token)
    assert claims["c"] == "cntr_1" and claims["o"] == 8000
    now[0] = 1060.0
    with pytest.raises(LinkRefused) as expired:
        signer.verify("port", token)
    assert expired.value.code is ErrorCode.link_expired
    assert "expired at" in expired.value.message


@pytest.mark.parametrize(
    "mangle",
    [
        lambda t: t[:-1] + ("A" if t[-1] != "A" else "B"),  # the signature
        lambda t: t[:5] + ("A" if t[5] != "A" else "B") + t[6:],  # the payload
        lambda t: t.split(".")[0],  # no signature
        lambda t: t + ".x",
        lambda t: "",
        lambda t: "a" * 5000,
    ],
)
def test_an_altered_token_is_invalid(mangle: object) -> None:
    signer = Signer(KEY, clock=lambda: 0.0)
    token = signer.sign("port", {"c": "cntr_1"}, expires_at=10)
    with pytest.raises(LinkRefused) as refused:
        signer.verify("port", mangle(token))  # type: ignore[operator]
    assert refused.value.code is ErrorCode.invalid_link


def test_purposes_and_keys_do_not_mix() -> None:
    signer = Signer(KEY, clock=lambda: 0.0)
    token = signer.sign("console", {"k": "key_1"}, expires_at=10)
    with pytest.raises(LinkRefused):
        signer.verify("port", token)
    with pytest.raises(LinkRefused):
        Signer(bytes(32), clock=lambda: 0.0).verify("console", token)
    assert signer.derive("csrf", "s1") != signer.derive("csrf", "s2")
    assert signer.derive("csrf", "s1") != Signer(bytes(32)).derive("csrf", "s1")


def test_the_key_file_is_made_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "private" / "signing.key"
    key = load_key(path)
    assert len(key) == 32
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(path.parent).st_mode) == 0o700
    assert load_key(path) == key
    path.write_text("not hex\n")
    with pytest.raises(SandboxError, match="does not hold a key"):
        load_key(path)
