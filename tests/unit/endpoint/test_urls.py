"""
Tests for amp.urls: strict endpoint URL parsing and component-wise
allow-list matching (an annotation must not be able to point amp elsewhere).
"""

from __future__ import annotations

import pytest

from amp.urls import BadURL, EndpointURL, URLPattern, parse_endpoint_url


@pytest.mark.parametrize(
    "url, scheme, host, port, path, origin",
    [
        ("http://127.0.0.1:8090/user-env", "http", "127.0.0.1", 8090, "/user-env", "http://127.0.0.1:8090"),
        ("http://ep.team-a.svc/mutate", "http", "ep.team-a.svc", 80, "/mutate", "http://ep.team-a.svc:80"),
        ("https://ep.team-a.svc", "https", "ep.team-a.svc", 443, "/", "https://ep.team-a.svc:443"),
        ("HTTPS://EP.Example:8443/A?x=1", "https", "ep.example", 8443, "/A?x=1", "https://ep.example:8443"),
        ("http://[::1]:8080/x", "http", "::1", 8080, "/x", "http://[::1]:8080"),
        ("https://[fd00::1]/x", "https", "fd00::1", 443, "/x", "https://[fd00::1]:443"),
        ("  http://127.0.0.1:1/x  ", "http", "127.0.0.1", 1, "/x", "http://127.0.0.1:1"),
    ],
)
def test_parse_endpoint_url(url: str, scheme: str, host: str, port: int, path: str, origin: str) -> None:
    parsed = parse_endpoint_url(url)
    assert (parsed.scheme, parsed.host, parsed.port, parsed.path) == (scheme, host, port, path)
    assert parsed.origin == origin
    assert parsed.url == url.strip()


@pytest.mark.parametrize(
    "url, fragment",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("ftp://127.0.0.1/x", "scheme 'ftp' is not http or https"),
        ("file:///etc/passwd", "scheme 'file'"),
        ("gopher://127.0.0.1:70/", "scheme 'gopher'"),
        ("127.0.0.1:8090/x", "is not http or https"),
        ("//127.0.0.1/x", "scheme ''"),
        ("http://user:secret@127.0.0.1/x", "credentials"),
        ("http://user@127.0.0.1/x", "credentials"),
        ("http://127.0.0.1:80@evil.example/", "credentials"),
        ("http://127.0.0.1/a b", "whitespace or control"),
        ("http://127.0.0.1/a\r\nHost: evil", "whitespace or control"),
        ("http://127.0.0.1/a\nb", "whitespace or control"),
        ("http://127.0.0.1/\tx", "whitespace or control"),
        ("http://127.0.0.1/\x00", "whitespace or control"),
        ("http://127.0.0.1/\x7f", "whitespace or control"),
        ("http:///x", "no host"),
        ("http://:8080/x", "no host"),
        ("http://127.0.0.1:0/", "port 0 is out of range"),
        ("http://127.0.0.1:99999/", "malformed"),
        ("http://127.0.0.1:http/", "malformed"),
        ("http://127.0.0.1:-1/", "malformed"),
        ("http://[::1/x", "malformed"),
        ("http://127.0.0.1/x#frag", "fragment"),
        ("http://127.0.0.1/" + "a" * 2100, "longer than 2048"),
        ("http://127.0.0.1:8090/\u00fc", "non-ASCII"),
        ("http://b\u00fccher.svc:8080/x", "non-ASCII"),
        ("http://127.0.0.1/a\u2028b", "non-ASCII"),
        ("http://127.0.0.1/a\u00a0b", "non-ASCII"),
    ],
)
def test_parse_endpoint_url_rejects(url: str, fragment: str) -> None:
    with pytest.raises(BadURL) as e:
        parse_endpoint_url(url)
    assert fragment in str(e.value)


def test_non_string_url_is_rejected() -> None:
    with pytest.raises(BadURL):
        parse_endpoint_url(None)  # type: ignore[arg-type]


# ---------------------------------------------------------------- patterns


@pytest.mark.parametrize(
    "text, scheme, host, port, path",
    [
        ("http://127.0.0.1:*/*", "http", "127.0.0.1", "*", "/*"),
        ("http://*.svc:8080/mutate/*", "http", "*.svc", "8080", "/mutate/*"),
        ("https://EP.svc", "https", "ep.svc", "443", "*"),
        ("http://h/x", "http", "h", "80", "/x"),
        ("*://h/x", "*", "h", "*", "/x"),
        ("http://[::1]:*/*", "http", "::1", "*", "/*"),
        ("http://[::1]/x", "http", "::1", "80", "/x"),
    ],
)
def test_pattern_parse(text: str, scheme: str, host: str, port: str, path: str) -> None:
    p = URLPattern.parse(text)
    assert (p.scheme, p.host, p.port, p.path) == (scheme, host, port, path)
    assert p.text == text


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("127.0.0.1:*/*", "must look like scheme://"),
        ("ftp://h/*", "scheme must be http, https or *"),
        ("http://user@h/*", "credentials"),
        ("http://:80/x", "has no host"),
        ("http:///x", "has no host"),
        ("http://h:port/x", "port must be a number 1-65535 or *"),
        ("http://h:70000/x", "port must be"),
        ("http://h:0/x", "port must be"),
        ("http://h:\u00b2/x", "port must be"),
        ("http://[::1/x", "unclosed ["),
    ],
)
def test_pattern_parse_rejects(text: str, fragment: str) -> None:
    with pytest.raises(ValueError) as e:
        URLPattern.parse(text)
    assert fragment in str(e.value)


@pytest.mark.parametrize(
    "pattern, url, expected",
    [
        # the dev allow-list
        ("http://127.0.0.1:*/*", "http://127.0.0.1:8090/user-env", True),
        ("http://127.0.0.1:*/*", "http://127.0.0.1/", True),
        ("http://127.0.0.1:*/*", "https://127.0.0.1:8090/x", False),
        ("http://127.0.0.1:*/*", "http://127.0.0.1.evil.example/", False),
        ("http://127.0.0.1:*/*", "http://127.0.0.1.evil.example:8090/x", False),
        ("http://127.0.0.1:*/*", "http://127.0.0.2:8090/x", False),
        ("http://127.0.0.1:*/*", "http://localhost:8090/x", False),
        ("http://127.0.0.1:*/*", "http://evil.example/127.0.0.1:80/", False),
        # in-cluster services
        ("http://*.svc:*/*", "http://ep.team-a.svc:8080/mutate", True),
        ("http://*.svc:*/*", "http://ep.team-a.svc.evil.example/mutate", False),
        ("http://*.svc:*/*", "http://svc/mutate", False),
        ("http://*.svc.cluster.local:*/*", "http://ep.ns.svc.cluster.local:80/", True),
        # ports: a pattern without a port means the default port
        ("http://h/*", "http://h/x", True),
        ("http://h/*", "http://h:80/x", True),
        ("http://h/*", "http://h:8080/x", False),
        ("https://h", "https://h:443/any/path?q=1", True),
        ("https://h", "https://h:8443/", False),
        ("http://h:8080/*", "http://h:8080/x", True),
        ("http://h:8080/*", "http://h:8081/x", False),
        # paths
        ("http://h:8080/mutate/*", "http://h:8080/mutate/a", True),
        ("http://h:8080/mutate/*", "http://h:8080/mutate", False),
        ("http://h:8080/mutate/*", "http://h:8080/other/mutate/a", False),
        ("http://h:8080/mutate", "http://h:8080/mutate", True),
        ("http://h:8080/mutate", "http://h:8080/mutate/x", False),
        # scheme and host case, wildcard scheme, IPv6
        ("*://h:*/*", "https://h:1/x", True),
        ("http://EP.svc:*/*", "http://ep.svc:1/x", True),
        ("http://[::1]:*/*", "http://[::1]:9/x", True),
        ("http://[::1]:*/*", "http://127.0.0.1:9/x", False),
    ],
)
def test_pattern_matching(pattern: str, url: str, expected: bool) -> None:
    assert URLPattern.parse(pattern).matches(parse_endpoint_url(url)) is expected


def test_userinfo_trick_cannot_reach_the_allow_list() -> None:
    """
    C{http://127.0.0.1:80@evil.example/} connects to evil.example; it is
    refused outright, and even the host it names does not match.
    """
    with pytest.raises(BadURL):
        parse_endpoint_url("http://127.0.0.1:80@evil.example/")
    smuggled = EndpointURL("http://127.0.0.1:80@evil.example/", "http", "evil.example", 80, "/")
    assert not URLPattern.parse("http://127.0.0.1:*/*").matches(smuggled)
