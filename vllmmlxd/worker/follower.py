"""A rank other than 0 of a distributed entry: load its share, then follow rank 0 until told to stop.

Run by the daemon as ``python -m vllmmlxd.worker.follower --name NAME`` (locally, or over ssh on
another host) with the entry's ResolvedModel as one JSON line on stdin and MLX's launcher
variables in its environment. It serves nothing: rank 0 has the port. Stdin closing means the
daemon is gone (the rank ends at once); any failure of the lockstep ends it with exit 5, and
the daemon restarts the whole unit.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

from ..config.schema import ResolvedModel
from ..log import log_event, setup_logging
from ..paths import ensure_private_dir, resolve_state_dir
from ..runtime import cpus as cpu_shares
from .main import EXIT_LOAD_FAILED, _entry_from, choose_blas, read_line, start_lifeline
from .ranks import EXIT_RANK_FAILED, EXIT_RANKS_DISAGREE, RankLost, RanksDisagree, load_share

logger = logging.getLogger("vllmmlxd.worker")


def follow(config: ResolvedModel, key: str, state_dir: Path) -> int:
    state_dir = ensure_private_dir(state_dir)
    choose_blas(config, None, state_dir)  # before anything imports mlx
    from ..engine.distributed.follow import Follower
    from ..engine.distributed.rank_group import join
    from ..engine.distributed.ring_link import RingLink
    from ..engine.options import engine_options
    from ..runtime.memory import read_machine_memory

    started = time.perf_counter()
    try:
        joined = join(config)
    except RanksDisagree as exc:
        log_event(logger, "rank.disagree", logging.ERROR, model=key, error=str(exc))
        return EXIT_RANKS_DISAGREE
    except RankLost as exc:
        log_event(logger, "rank.join_failed", logging.ERROR, model=key, error=str(exc))
        return EXIT_RANK_FAILED
    try:
        loaded = load_share(config, joined, state_dir)
    except Exception as exc:
        log_event(logger, "model.load_failed", logging.ERROR, model=key, rank=joined.rank, error=str(exc))
        return EXIT_LOAD_FAILED
    log_event(
        logger,
        "rank.following",
        model=key,
        rank=joined.rank,
        pid=os.getpid(),
        load_s=round(time.perf_counter() - started, 2),
    )
    options = engine_options(config, read_machine_memory(working_set=False).physical or 0, state_dir=state_dir)
    follower = Follower(loaded.model, options, RingLink(joined.group))
    try:
        follower.run()
    except Exception as exc:  # a peer died, a frame was damaged, a plan did not fit: the unit restarts
        log_event(
            logger, "rank.failed", logging.ERROR, model=key, rank=joined.rank, error=f"{type(exc).__name__}: {exc}"
        )
        return EXIT_RANK_FAILED
    log_event(logger, "rank.stopped", model=key, rank=joined.rank)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllmmlxd.worker.follower", description="a vllmmlxd rank")
    parser.add_argument("--name", required=True, help="the model entry's name")
    parser.add_argument("--state-dir")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--cpus", type=cpu_shares.parse_cpus, help="the cores to run on: this rank's share")
    args = parser.parse_args(argv)
    if args.cpus:
        cpu_shares.pin(args.cpus)
    setup_logging(args.log_level, model=args.name)
    config = _entry_from(read_line(sys.stdin.fileno()), args.name)
    if config is None or config.distributed is None:
        return EXIT_LOAD_FAILED
    start_lifeline(sys.stdin.fileno(), logger, "worker.orphaned")
    return follow(config, args.name, resolve_state_dir(args.state_dir))


if __name__ == "__main__":
    from ..runtime import import_memo

    import_memo.install()  # before the model's load imports transformers
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # as the worker: no interpreter teardown under MLX's threads
