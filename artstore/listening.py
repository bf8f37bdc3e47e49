"""The listening sockets of artstore's servers (`artstore ui`, `artstore serve`).

Bound here rather than by uvicorn, so that port 0 picks a free port whose address the
command can print before the first request, and a taken port is one clear error.
"""

from __future__ import annotations

import ipaddress
import socket


def is_loopback(host: str) -> bool:
    """Whether `host` only reaches this machine (`localhost`, 127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def listening_socket(host: str, port: int, *, backlog: int = 1024) -> socket.socket:
    """A listening socket on (host, port) (port 0: a free one); OSError when taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    # Accepted connections inherit it: without it, uvicorn's response (head, then body,
    # written apart) waited on the client's delayed ACK, 40-50 ms per request on loopback.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def socket_url(sock: socket.socket, scheme: str = "http") -> str:
    """`scheme://host:port` of a bound socket (an IPv6 host in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"
