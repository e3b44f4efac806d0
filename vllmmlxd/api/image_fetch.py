"""Fetching an image URL for a vision model whose entry allows it (``allow_image_urls``).

The worker reaches out on a client's behalf, so the fetch is an SSRF surface: the host is
resolved here, every address it resolved to must pass ``images.url_verdict`` (global, unless the
entry lists the host in ``allowed_image_hosts``), and the connection goes to the address that was
checked, never to a second lookup's answer (a name that changes its answer between the check and
the connection gets nowhere). Redirects are followed a few times, each hop checked the same way.
The body is read within ``max_image_mb`` and the whole fetch within ``image_url_timeout``. It is
asked for unencoded and read as it comes: a compressed body is refused, never inflated (16 KB of
zstd would otherwise become a gigabyte before any size check could see it).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterable
from urllib.parse import urljoin, urlsplit, urlunsplit

import httpx

from ..errors import InvalidRequest, PayloadTooLarge
from .images import ImageLimits, Source, checked_bytes, url_verdict

MAX_REDIRECTS = 3


async def fetch(
    url: str, where: str, limits: ImageLimits, *, allow: bool, allowed_hosts: Iterable[str], timeout: float
) -> Source:
    """The image at ``url``, or a 400 (413 when too large) naming the part and why."""
    hosts = tuple(allowed_hosts)
    if not allow:  # refused before any lookup
        raise InvalidRequest(f"{where}: {url_verdict(url, (), allow=False, allowed_hosts=hosts)}", param=where)
    try:
        return await asyncio.wait_for(_follow(url, where, limits, hosts), timeout)
    except (TimeoutError, httpx.TimeoutException):
        raise InvalidRequest(f"{where}: the image URL could not be fetched within {timeout:g} s", param=where) from None
    except httpx.HTTPError as exc:
        raise InvalidRequest(
            f"{where}: the image URL could not be fetched ({type(exc).__name__})", param=where
        ) from None


async def _follow(url: str, where: str, limits: ImageLimits, hosts: tuple[str, ...]) -> Source:
    async with httpx.AsyncClient(trust_env=False, follow_redirects=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            address = await _checked_address(url, where, hosts)
            parts = urlsplit(url)
            pinned = urlunsplit(parts._replace(netloc=_netloc(address, parts.port)))
            host_header = parts.hostname + (f":{parts.port}" if parts.port else "") if parts.hostname else ""
            request = client.build_request(
                "GET",
                pinned,
                headers={"Host": host_header, "Accept": "image/*", "Accept-Encoding": "identity"},
                extensions={"sni_hostname": parts.hostname} if parts.scheme == "https" else {},
            )
            response = await client.send(request, stream=True)
            try:
                if response.is_redirect and "location" in response.headers:
                    url = urljoin(url, response.headers["location"])
                    continue
                if response.status_code != 200:
                    raise InvalidRequest(f"{where}: the image URL answered HTTP {response.status_code}", param=where)
                return checked_bytes(await _body(response, where, limits), None, where)
            finally:
                await response.aclose()
    raise InvalidRequest(f"{where}: the image URL redirected more than {MAX_REDIRECTS} times", param=where)


async def _checked_address(url: str, where: str, hosts: tuple[str, ...]) -> str:
    """The address to connect to for ``url``, once every address its host has passed the verdict."""
    parts = urlsplit(url)
    found: list[str] = []
    if parts.scheme in ("http", "https") and parts.hostname:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(parts.hostname, port, type=socket.SOCK_STREAM)
            found = list(dict.fromkeys(str(info[4][0]) for info in infos))
        except (socket.gaierror, UnicodeError):
            found = []
    refusal = url_verdict(url, found, allow=True, allowed_hosts=hosts)
    if refusal:
        raise InvalidRequest(f"{where}: {refusal}", param=where)
    if not found:  # a listed host is not checked, but it must still resolve
        raise InvalidRequest(f"{where}: the host {parts.hostname!r} of the image URL does not resolve", param=where)
    return found[0]


def _netloc(address: str, port: int | None) -> str:
    host = f"[{address}]" if ":" in address else address
    return f"{host}:{port}" if port else host


async def _body(response: httpx.Response, where: str, limits: ImageLimits) -> bytes:
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity"):
        raise InvalidRequest(
            f"{where}: the image URL answered with a {encoding}-encoded body; images are fetched unencoded "
            "(Accept-Encoding: identity) and a compressed body is never inflated",
            param=where,
        )
    too_big = PayloadTooLarge(f"{where}: the image is larger than this model's {limits.max_bytes:,} bytes", param=where)
    declared = response.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limits.max_bytes:
        raise too_big
    data = bytearray()
    async for chunk in response.aiter_raw():  # the bytes as sent: nothing is decoded
        data += chunk
        if len(data) > limits.max_bytes:
            raise too_big
    return bytes(data)
