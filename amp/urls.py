"""
Endpoint URLs: parsing, validation, allow-list patterns and the one way
they are shown (pure).

An endpoint URL comes from a namespace annotation, which anyone who can edit
that namespace controls, so it is parsed strictly before amp goes near it:
only ``http`` and ``https``, no credentials, no control characters, only
ASCII, a host and a port that make sense.  Allow-list patterns are matched
component by component (scheme, host, port, path), never as one string, so
that tricks such as ``http://127.0.0.1:80@evil/`` cannot satisfy
``http://127.0.0.1:*/*``.

A URL may carry a token in its query (C{?token=...}), so amp never repeats
one as written: L{shown_url} decides how every output shows an endpoint
URL (origin and path, never query, user information or fragment), and
L{step_names} names the steps of a chain with it, telling apart steps that
differ only in their query by their position.

The address side of the allow-list lives here too: L{parse_networks} reads
C{endpoints.deny_networks} (CIDRs and the names in L{NAMED_NETWORKS}) and
L{denied_network} says whether an address falls in one of them, looking
through IPv4-mapped and NAT64 IPv6 addresses to the IPv4 address they carry.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Iterable, Optional, Sequence, Union
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


# ---------------------------------------------------------------- showing


def shown_url(url: Union[EndpointURL, str], limit: int = 200) -> str:
    """
    The one way amp shows an endpoint URL, in every output (warnings, audit
    and Pod annotations, deny messages, the log, metric labels,
    C{/debug/reviews}, C{amp explain}, C{--check}): its scheme, host, port
    and path, never its query, user information or fragment, where tokens
    and passwords travel.

    A checked L{EndpointURL} is shown as its origin and path
    (C{http://injector.tools.svc:8080/mutate}).  Text that is not a URL amp
    will call (an annotation, or its piece that failed the check) is shown
    as far as it reads the same way, each URL of a chain in turn:
    credentials replaced by C{***@}, everything from the first C{?} or C{#}
    after the authority left out, anything but printable ASCII escaped
    (C{\\r}, C{\\x00}, C{\\u2028}), at most C{limit} characters.
    """
    if isinstance(url, EndpointURL):
        return escaped(url.origin + url.path.split("?", 1)[0], limit)
    return _clipped(" ".join(_escape(_shown_piece(piece)) for piece in CHAIN_SEPARATORS.split(url.strip())), limit)


#: What separates the URLs of a chain in an endpoint annotation.
CHAIN_SEPARATORS = re.compile(r"[ \n]+")


def _shown_piece(text: str) -> str:
    scheme, sep, rest = text.partition("://")
    if not sep:
        scheme, rest = "", text
    end = min((i for i in (rest.find(c) for c in "/?#") if i >= 0), default=len(rest))
    authority, after = rest[:end], rest[end:]
    if "@" in authority:
        authority = "***@" + authority.rsplit("@", 1)[1]
    cut = min((i for i in (after.find(c) for c in "?#") if i >= 0), default=len(after))
    return f"{scheme}{sep}{authority}{after[:cut]}"


def step_names(urls: Sequence[EndpointURL]) -> tuple[str, ...]:
    """
    How amp names each endpoint of a chain (L{shown_url}, never more): its
    origin; its origin and path when another step has the same origin;
    and, when steps differ only in what is never shown (the query), that
    followed by its position in the chain (C{http://h:80/m#2}).
    """
    origins = [u.origin for u in urls]
    shown = [shown_url(u) for u in urls]
    names = []
    for i, u in enumerate(urls):
        if origins.count(u.origin) == 1:
            names.append(u.origin)
        elif shown.count(shown[i]) == 1:
            names.append(shown[i])
        else:
            names.append(f"{shown[i]}#{i + 1}")
    return tuple(names)


def escaped(text: str, limit: int = 200) -> str:
    """
    C{text} with anything but printable ASCII escaped (C{\\r},
    C{\\x00}, C{\\u2028}), at most C{limit} characters: safe to repeat
    in a header, a log line or an annotation.
    """
    return _clipped(_escape(text), limit)


def _escape(text: str) -> str:
    return "".join(
        c if 0x20 < ord(c) < 0x7F else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}") for c in text
    )


def _clipped(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


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


# ---------------------------------------------------------------- address deny-list

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]

#: Names accepted in C{endpoints.deny_networks}, and the ranges they stand for.
NAMED_NETWORKS: dict[str, tuple[str, ...]] = {
    # This host.  Connecting to 0.0.0.0 or :: reaches the local host too.
    "loopback": ("127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128"),
    # Link-local: the cloud metadata services (169.254.169.254) live here.
    "link-local": ("169.254.0.0/16", "fe80::/10"),
    # Cloud metadata and credential services, including those outside the
    # link-local ranges: AWS's IPv6 instance metadata and EKS Pod Identity
    # (fd00:ec2::/...), ECS task metadata, Alibaba Cloud (100.100.100.200).
    "metadata": (
        "169.254.169.254/32",
        "169.254.170.2/32",
        "169.254.170.23/32",
        "fd00:ec2::254/128",
        "fd00:ec2::23/128",
        "100.100.100.200/32",
    ),
    # RFC 1918 and IPv6 unique local addresses.
    "private": ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"),
    # RFC 6598 shared address space (carrier-grade NAT; some clusters put
    # Pods or Services here).
    "cgnat": ("100.64.0.0/10",),
}

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def parse_networks(items: Iterable[str]) -> tuple[Network, ...]:
    """
    CIDRs (C{10.0.0.0/8}, C{fd00::/8}, a bare address) and names from
    L{NAMED_NETWORKS}, in order, without repeats.

    @raise ValueError: naming the item (C{item <i>: ...}) that is neither.
    """
    out: list[Network] = []
    for i, item in enumerate(items):
        texts = NAMED_NETWORKS.get(item.strip().lower())
        if texts is None:
            try:
                nets = [ipaddress.ip_network(item.strip(), strict=False)]
            except ValueError:
                names = ", ".join(NAMED_NETWORKS)
                raise ValueError(
                    f"item {i}: {item!r} is not a CIDR (like 10.0.0.0/8 or fd00::/8) or one of {names}"
                ) from None
        else:
            nets = [ipaddress.ip_network(t) for t in texts]
        out.extend(n for n in nets if n not in out)
    return tuple(out)


def denied_network(address: str, networks: Iterable[Network]) -> Optional[Network]:
    """
    The first of C{networks} that the IP address C{address} is in, or None.
    An IPv4-mapped (C{::ffff:a.b.c.d}) or NAT64 (C{64:ff9b::a.b.c.d}) IPv6
    address is also checked as the IPv4 address it carries, so an IPv4
    range covers every way of writing its addresses.

    @raise ValueError: if C{address} is not an IP address.
    """
    ip = ipaddress.ip_address(address)
    candidates: list[Union[ipaddress.IPv4Address, ipaddress.IPv6Address]] = [ip]
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            candidates.append(ip.ipv4_mapped)
        elif ip in _NAT64:
            candidates.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    for net in networks:
        for candidate in candidates:
            if candidate.version == net.version and candidate in net:
                return net
    return None
