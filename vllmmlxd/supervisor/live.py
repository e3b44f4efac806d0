"""Push a changed entry's live settings to its running worker, over the worker's private socket.

The worker applies them between requests (requests already running finish under the old
ones) and answers the hash of the config it now runs. A refusal (409: a key that needs a new
worker; 422: not a valid entry) or no answer is a failure the caller reports; the worker
then keeps its old settings. The entry travels with its secrets revealed, as on the worker's
stdin: the socket is 0600 in a 0700 folder. Reasons never carry a value, only key names.
"""

from __future__ import annotations

from pathlib import Path

import httpx

from .slot.process import UnitConfig

SETTINGS_PATH = "/internal/settings"


async def push_settings(health_socket: Path, config: UnitConfig, timeout: float = 5) -> tuple[bool, str | None]:
    """``(True, config_hash)`` once the worker runs ``config``; ``(False, reason)`` when it did not take it."""
    transport = httpx.AsyncHTTPTransport(uds=str(health_socket), verify=False)  # no TLS on a Unix socket
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://worker", timeout=timeout) as client:
            response = await client.post(
                SETTINGS_PATH, content=config.to_worker_json(), headers={"content-type": "application/json"}
            )
    except httpx.HTTPError as exc:
        return False, f"the worker did not answer the settings push: {type(exc).__name__}"
    try:
        body = response.json()
    except ValueError:
        body = {}
    if response.status_code != 200 or not isinstance(body, dict) or not body.get("ok"):
        reason = body.get("error") if isinstance(body, dict) else None
        return False, f"the worker refused the settings ({response.status_code}): {reason or response.reason_phrase}"
    expected = config.config_hash()
    if body.get("config_hash") != expected:  # the worker runs something else than what was sent
        return False, f"the worker reports config {body.get('config_hash')}, expected {expected}"
    return True, expected
