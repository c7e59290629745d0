"""Pure policy logic: entry validation, glob matching, coverage, secrets."""

from __future__ import annotations

import pytest

from shellbox.egress import policy as pol
from shellbox.errors import InvalidRequest


@pytest.mark.parametrize(
    ("pattern", "host", "expected"),
    [
        ("example.com", "example.com", True),
        ("example.com", "api.example.com", False),  # exact names cover no subdomain
        ("*.example.com", "api.example.com", True),
        ("*.example.com", "a.b.example.com", True),  # '*' is any run, dots included
        ("*.example.com", "example.com", False),
        ("google.*.com", "google.co.uk.com", True),
        ("google.*.com", "google.com", False),
        ("api-*.x.io", "api-eu.x.io", True),
        ("*", "anything.at.all", True),
        ("example.com", "EXAMPLE.COM.", True),  # hosts are normalized
        ("example.com", "example.com.evil.io", False),
        ("*.example.com", "example.com.evil.io", False),
    ],
)
def test_matching(pattern: str, host: str, expected: bool) -> None:
    assert pol.allows([pattern], host) is expected


def test_ip_literals_only_reach_the_any_policy() -> None:
    assert not pol.allows(["*.example.com"], "10.0.0.1")
    assert not pol.allows(["*.1"], "10.0.0.1")
    assert pol.allows(["*"], "10.0.0.1")
    assert pol.allows(["*"], "[::1]")


@pytest.mark.parametrize(
    ("outer", "inner", "expected"),
    [
        ("*", "*", True),
        ("*", "x.io", True),
        ("*.example.com", "api.example.com", True),
        ("*.example.com", "*.api.example.com", True),
        ("*.example.com", "*.com", False),
        ("*.example.com", "example.com", False),
        ("example.com", "*.example.com", False),
        ("a*", "ab*", True),
        ("ab*", "a*", False),
        ("*.x.io", "*", False),
    ],
)
def test_covers(outer: str, inner: str, expected: bool) -> None:
    assert pol.covers(outer, inner) is expected


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ("https://example.com", "scheme"),
        ("example.com/path", "path"),
        ("example.com:443", "port"),
        ("10.0.0.1", "IP address"),
        ("::1", "IP address"),
        ("[2001:db8::1]", "IP address"),
        ("1.2.*.4", "IP address"),
        ("Example.com", "lowercase"),
        (" example.com", "spaces"),
        ("exa mple.com", "a-z"),
        ("example..com", "empty label"),
        (".example.com", "empty label"),
        ("example.com.", "empty label"),
        ("-x.example.com", "'-'"),
        ("bücher.de", "ASCII"),
        ("", "non-empty"),
        ("a" * 64 + ".com", "63"),
    ],
)
def test_bad_entries_are_named(entry: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        pol.validate_allowlist(["ok.example.com", entry], param="allowed_domains")
    assert err.value.param == "allowed_domains[1]"
    assert words in err.value.message and repr(entry) in err.value.message


def test_entry_count() -> None:
    with pytest.raises(InvalidRequest, match="1 to 50"):
        pol.validate_allowlist([])
    with pytest.raises(InvalidRequest, match="1 to 50"):
        pol.validate_allowlist([f"h{i}.io" for i in range(51)])
    with pytest.raises(InvalidRequest, match="required"):
        pol.validate_allowlist(None)
    assert len(pol.validate_allowlist([f"h{i}.io" for i in range(50)])) == 50
    assert pol.validate_allowlist(["a.io", "a.io", "*"]) == ("a.io", "*")


def test_operator_bound_names_the_domain_outside_it() -> None:
    bound = ["*.corp.example", "pypi.org"]
    assert pol.validate_allowlist(["pypi.org", "git.corp.example"], operator=bound)
    with pytest.raises(InvalidRequest) as err:
        pol.validate_allowlist(["pypi.org", "evil.io"], operator=bound)
    assert err.value.param == "allowed_domains[1]"
    assert "'evil.io' is outside this server's egress allowlist" in err.value.message
    with pytest.raises(InvalidRequest, match="'\\*' is outside"):
        pol.validate_allowlist(["*"], operator=bound)
    with pytest.raises(InvalidRequest, match="outside"):
        pol.validate_allowlist(["*.pypi.org"], operator=bound)


def test_operator_allowlist_itself_is_checked() -> None:
    assert pol.validate_operator_allowlist(["a.io", " *.b.io "]) == ["a.io", "*.b.io"]
    with pytest.raises(ValueError, match=r"'https://a\.io'"):
        pol.validate_operator_allowlist(["https://a.io"])
    with pytest.raises(ValueError, match="at least one"):
        pol.validate_operator_allowlist([" "])


def secret(**kw: object) -> dict[str, object]:
    return {"domain": "api.example.com", "name": "TOKEN", "value": "v-123", **kw}


def test_secrets_valid() -> None:
    out = pol.validate_secrets(
        [secret(), secret(domain="*.example.com"), secret(domain="x.example.com", name="B")],
        ["*.example.com"],
    )
    assert [s.name for s in out] == ["TOKEN", "TOKEN", "B"]


@pytest.mark.parametrize(
    ("raw", "param", "words"),
    [
        (secret(domain="other.io"), "domain_secrets[0].domain", "not allowed by allowed_domains"),
        (secret(domain="*.io"), "domain_secrets[0].domain", "not allowed"),
        (secret(domain="https://x"), "domain_secrets[0].domain", "scheme"),
        (secret(name="1TOKEN"), "domain_secrets[0].name", "environment variable name"),
        (secret(name="MY-TOKEN"), "domain_secrets[0].name", "environment variable name"),
        (secret(name="HTTPS_PROXY"), "domain_secrets[0].name", "reserved"),
        (secret(value="a\r\nX-Evil: 1"), "domain_secrets[0].value", "printable ASCII"),
        (secret(value="x" * 9000), "domain_secrets[0].value", "printable ASCII"),
        (secret(value=""), "domain_secrets[0].value", "required"),
        ({"domain": "api.example.com", "name": "T"}, "domain_secrets[0].value", "required"),
        ("TOKEN=v", "domain_secrets[0]", "object"),
    ],
)
def test_bad_secrets(raw: object, param: str, words: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        pol.validate_secrets([raw], ["*.example.com"])
    assert err.value.param == param
    assert words in err.value.message
    assert "a\r\nX-Evil" not in err.value.message and "xxxx" not in err.value.message


def test_duplicate_secret_is_refused() -> None:
    with pytest.raises(InvalidRequest, match="repeats"):
        pol.validate_secrets([secret(), secret()], ["*.example.com"])


def test_public_view_has_no_secrets() -> None:
    p = pol.validate_policy(
        {"type": "allowlist", "allowed_domains": ["api.example.com"], "domain_secrets": [secret()]},
        operator=None,
    )
    assert p.public() == {"type": "allowlist", "allowed_domains": ["api.example.com"]}
    assert p.secrets[0].value == "v-123"
