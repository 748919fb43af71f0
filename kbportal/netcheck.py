"""Outbound URL checks: a configured URL may not reach the portal's own private network.

A data source's ``base_url`` / ``server_url`` / ``url`` (or a git ``path`` that is a URL) is
resolved with ``socket.getaddrinfo`` and refused when any address it resolves to is not a
global unicast address: loopback (127.0.0.0/8, ::1), private (RFC 1918, 100.64.0.0/10),
link-local (169.254.0.0/16, the cloud metadata service 169.254.169.254 included, fe80::/10),
unique-local IPv6 (fc00::/7), multicast, unspecified (0.0.0.0, ::), reserved and documentation
ranges, and IPv4 addresses mapped into IPv6 (``::ffff:127.0.0.1``) by the IPv4 rule.

The check runs when a source is saved and again each time a connector is built to connect
(a name may resolve elsewhere later: DNS rebinding). ``guard_session`` goes further for
``requests`` sessions: it checks the address each new connection is actually connected to,
redirects included, so a name that changes between the check and the connection is refused.

Opting out: a source's ``allow_private_network`` flag (operators, in the admin) or the
deployment setting ``KB_ALLOW_PRIVATE_URLS``.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit

from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class PrivateAddressError(OSError):
    """A URL resolves to (or a connection reached) an address outside the public internet.

    An ``OSError`` so that HTTP clients treat it as a failed connection (and wrap it with the
    URL); the message names the field or host, the address and its range.
    """


def address_problem(address: str | IPAddress) -> str | None:
    """Why ``address`` may not be reached (``"loopback"``, ``"private"``, ...), or ``None`` if it is global."""
    ip = ipaddress.ip_address(address.split("%", 1)[0] if isinstance(address, str) else address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    for name, flag in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("unique-local" if isinstance(ip, ipaddress.IPv6Address) else "private", ip.is_private),
        ("reserved", ip.is_reserved),
    ):
        if flag:
            return name
    if not ip.is_global:
        return "not globally routable"
    return None


def url_host(url: str) -> tuple[str, int] | None:
    """(host, port) of a network URL (``scheme://host...`` or scp-like ``user@host:path``), else ``None``."""
    text = url.strip()
    if "://" not in text:
        at, colon = text.find("@"), text.find(":")
        if 0 < at < colon and "/" not in text[:colon]:  # git's scp-like form
            return text[at + 1 : colon], 22
        return None
    parts = urlsplit(text)
    if parts.scheme.lower() == "file" or not parts.hostname:
        return None
    default = {"https": 443, "http": 80, "ssh": 22, "git": 9418, "wss": 443, "ws": 80}.get(parts.scheme.lower(), 443)
    try:
        port = parts.port or default
    except ValueError:
        port = default
    return parts.hostname, port


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to (``socket.getaddrinfo``), in resolver order, deduplicated.

    Raises ``PrivateAddressError`` when the name does not resolve.
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise PrivateAddressError(f"host {host!r} cannot be resolved: {exc}") from exc
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def check_url(url: str, *, field: str) -> list[str]:
    """Resolve ``url``'s host and refuse it when any address is not public.

    Returns the resolved addresses (empty for a local path or ``file://``). Raises
    ``PrivateAddressError`` naming ``field``, the host, the address and its range.
    """
    target = url_host(url)
    if target is None:
        return []
    host, port = target
    addresses = resolve(host, port)
    for address in addresses:
        problem = address_problem(address)
        if problem:
            raise PrivateAddressError(
                f"config field {field!r}: host {host!r} resolves to {address}, a {problem} address; "
                "connections to private networks are refused unless an operator sets "
                "allow_private_network on the source (or KB_ALLOW_PRIVATE_URLS for the deployment)"
            )
    return addresses


def _check_peer(sock: socket.socket, host: str) -> None:
    address = sock.getpeername()[0]
    problem = address_problem(address)
    if problem:
        sock.close()
        raise PrivateAddressError(f"refused to connect to {host!r}: it resolved to {address}, a {problem} address")


class _GuardedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _check_peer(sock, self.host)
        return sock


class _GuardedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        _check_peer(sock, self.host)
        return sock


class _GuardedHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


class PublicOnlyAdapter(HTTPAdapter):
    """A ``requests`` transport adapter whose every new connection must reach a public address.

    The peer address of the connected socket is checked (not a separate DNS answer), so DNS
    rebinding and redirects to private hosts fail with ``PrivateAddressError`` (wrapped by
    ``requests`` in a ``ConnectionError``). Connections through a proxy are not checked (the
    operator chose the proxy).
    """

    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _GuardedHTTPConnectionPool,
            "https": _GuardedHTTPSConnectionPool,
        }


def guard_session(session) -> None:
    """Mount ``PublicOnlyAdapter`` on a ``requests.Session`` for http:// and https://."""
    session.mount("https://", PublicOnlyAdapter())
    session.mount("http://", PublicOnlyAdapter())
