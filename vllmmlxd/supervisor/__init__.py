"""The daemon's supervisor: one task over every unit the config describes (``supervisor``), each
model's slot an actor of its own (the ``slot`` subpackage: its phase decided by ``transitions``' table), reloads
planned as plain values (``plan``, ``reload``), memory admission (``memory``, ``loads``), the
gateway's routing table (``routing``), model files (``files``), and time read from a ``clock``.

Other packages use what ``__all__`` names (the daemon and vllmmlxctl); the rest is its own.
"""

__all__ = ["live", "memory", "notify", "slot", "supervisor", "views", "watcher"]
