"""The gateway: one address for every model, routing each request by its ``model`` to the
entry's worker or to an upstream daemon (see ``main.py`` for the process, ``app.py`` for its routes)."""
