"""The listening sockets a slot keeps besides its own address (the gateway's Ollama port).

Bound at the first spawn and kept across restarts, like the slot's own socket, so a restart
refuses no connection there either; owned by the slot's actor.
"""

from __future__ import annotations

import socket

from ...config.gateway import GatewaySpec
from ...sockets import bind_tcp
from .process import UnitConfig


def extra_listeners(config: UnitConfig) -> dict[str, tuple[str, int]]:
    """The listening sockets a unit needs besides its own address, by the flag that hands each to its
    process: the gateway's Ollama listener when its spec sets one; nothing for a model."""
    return config.extra_listeners() if isinstance(config, GatewaySpec) else {}


class ExtraListeners:
    def __init__(self) -> None:
        self.socks: dict[tuple[str, int], socket.socket] = {}  # by address

    def fds_for(self, config: UnitConfig) -> dict[str, int]:
        """The extra listening sockets ``config`` asks for, as ``{flag: fd}``: kept from the last
        spawn where the address is the same, bound anew where it changed (the old one closed).
        Raises OSError when one cannot be bound."""
        wanted = extra_listeners(config)
        addresses = set(wanted.values())
        for address in [a for a in self.socks if a not in addresses]:
            self.socks.pop(address).close()
        for host, port in addresses - set(self.socks):
            try:
                self.socks[(host, port)] = bind_tcp(host, port)
            except OSError as exc:
                raise OSError(exc.errno, f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        return {flag: self.socks[address].fileno() for flag, address in wanted.items()}

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close()
        self.socks = {}
