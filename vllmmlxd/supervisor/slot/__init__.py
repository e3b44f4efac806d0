"""One model entry under supervision: its slot's actor (``slot``) and the messages it takes
(``slot_messages``), its phase decided by ``transitions``' table, its workers spawned, watched
and drained (``slot_workers``, ``process``; a sharded entry's ranks: ``ranks``,
``rank_launch``), the stand-in that answers while none serves (``responder``), and what it
tells its callers and the logs (``slot_news``, ``exit_reason``, ``log_lines``)."""

__all__ = [
    "backoff",
    "exit_reason",
    "log_lines",
    "process",
    "rank_launch",
    "ranks",
    "responder",
    "slot",
    "slot_news",
    "slot_workers",
    "transitions",
    "tuning",
]
