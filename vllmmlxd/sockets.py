"""Listening sockets, made the same way by the daemon (which owns them) and by a
worker run by hand. Stdlib only."""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path


def http_url(host: str, port: int, path: str = "/v1") -> str:
    """``http://host:port/v1``, with an IPv6 host in brackets."""
    return f"http://{f'[{host}]' if ':' in host else host}:{port}{path}"


def is_loopback(host: str) -> bool:
    """Does binding ``host`` keep a port to this machine? (A name other than localhost: assume not.)"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def bind_tcp(host: str, port: int) -> socket.socket:
    """A listening TCP socket that child processes can inherit; IPv6 when the host is one."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio sets TCP_NODELAY only on sockets that say they are TCP (protocol 0 does not),
    # and without it a stream's small writes wait on the client's delayed ACKs (tens of ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    sock.set_inheritable(True)
    return sock


def bind_unix(path: Path) -> socket.socket:
    """A listening Unix socket only this user can reach (mode 0600, parent 0700)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        sock.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    sock.listen(128)
    return sock
