"""The gateway: one address for every model, routing each request by its ``model`` to the
entry's worker or to an upstream daemon (see ``main.py`` for the process, ``app.py`` for its routes).

It runs as its own process (``python -m vllmmlxd.gateway``), supervised like a worker: no other
package imports it, so its surface is its command line and the spec the daemon hands it
(``config.gateway.GatewaySpec``).
"""

__all__: list[str] = []
