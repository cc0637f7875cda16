"""
Endpoint URLs: parsing, validation and allow-list patterns (pure).

An endpoint URL comes from a namespace annotation, which anyone who can edit
that namespace controls, so it is parsed strictly before amp goes near it:
only ``http`` and ``https``, no credentials, no control characters, only
ASCII, a host and a port that make sense.  Allow-list patterns are matched
component by component (scheme, host, port, path), never as one string, so
that tricks such as ``http://127.0.0.1:80@evil/`` cannot satisfy
``http://127.0.0.1:*/*``.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}


class BadURL(ValueError):
    """
    An endpoint URL that amp refuses to call; the message says why.
    """


@dataclass(frozen=True)
class EndpointURL:
    """
    A checked endpoint URL.

    @ivar origin: C{scheme://host:port}, the unit of pooling, breaking and
        metric labels.
    """

    url: str
    scheme: str
    host: str
    port: int
    path: str

    @property
    def origin(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_endpoint_url(url: str) -> EndpointURL:
    """
    Parse and check an endpoint URL taken from an annotation.

    @raise BadURL: with a message that names the problem.
    """
    if not isinstance(url, str) or not url.strip():
        raise BadURL("endpoint URL is empty")
    url = url.strip()
    if len(url) > 2048:
        raise BadURL("endpoint URL is longer than 2048 characters")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in url):
        raise BadURL("endpoint URL contains whitespace or control characters")
    if not url.isascii():
        # Unicode whitespace and look-alike characters hide in annotations,
        # and the request line must be ASCII: IDN hosts go in as punycode,
        # other characters percent-encoded.
        raise BadURL("endpoint URL contains non-ASCII characters (use punycode or percent-encoding)")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as e:
        raise BadURL(f"endpoint URL is malformed: {e}") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise BadURL(f"endpoint URL scheme {parts.scheme!r} is not http or https")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise BadURL("endpoint URL must not contain credentials")
    host = (parts.hostname or "").lower()
    if not host:
        raise BadURL("endpoint URL has no host")
    if port is None:
        port = DEFAULT_PORTS[scheme]
    if not 0 < port < 65536:
        raise BadURL(f"endpoint URL port {port} is out of range")
    if parts.fragment:
        raise BadURL("endpoint URL must not have a fragment")
    path = parts.path or "/"
    if parts.query:
        path = f"{path}?{parts.query}"
    return EndpointURL(url=url, scheme=scheme, host=host, port=port, path=path)


def host_is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class URLPattern:
    """
    One allow-list or override pattern, e.g. C{http://127.0.0.1:*/*} or
    C{http://*.svc:8080/mutate/*}.  C{*} in the host, port or path matches
    anything within that component.  A pattern without a port means the
    scheme's default port; a pattern without a path matches every path.
    """

    text: str
    scheme: str
    host: str
    port: str
    path: str

    @classmethod
    def parse(cls, text: str) -> "URLPattern":
        if not isinstance(text, str) or "://" not in text:
            raise ValueError(f"URL pattern {text!r} must look like scheme://host[:port][/path]")
        scheme, rest = text.split("://", 1)
        scheme = scheme.lower()
        if scheme not in DEFAULT_PORTS and scheme != "*":
            raise ValueError(f"URL pattern {text!r}: scheme must be http, https or *")
        if "@" in rest:
            raise ValueError(f"URL pattern {text!r} must not contain credentials")
        slash = rest.find("/")
        hostport, path = (rest, "*") if slash < 0 else (rest[:slash], rest[slash:])
        if hostport.startswith("["):
            end = hostport.find("]")
            if end < 0:
                raise ValueError(f"URL pattern {text!r}: unclosed [ in host")
            host, tail = hostport[1:end], hostport[end + 1 :]
            port = tail[1:] if tail.startswith(":") else ""
        elif ":" in hostport:
            host, port = hostport.rsplit(":", 1)
        else:
            host, port = hostport, ""
        if not host:
            raise ValueError(f"URL pattern {text!r} has no host")
        if port == "":
            port = "*" if scheme == "*" else str(DEFAULT_PORTS[scheme])
        elif port != "*" and not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"URL pattern {text!r}: port must be a number 1-65535 or *")
        return cls(text=text, scheme=scheme, host=host.lower(), port=port, path=path)

    def matches(self, url: EndpointURL) -> bool:
        if self.scheme != "*" and self.scheme != url.scheme:
            return False
        if self.port != "*" and int(self.port) != url.port:
            return False
        if not fnmatchcase(url.host, self.host):
            return False
        return fnmatchcase(url.path, self.path)
