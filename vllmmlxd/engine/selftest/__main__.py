"""``python -m vllmmlxd.engine.selftest --model SPEC``: the doctor's engine self-test in a process
of its own (``vllmmlxctl`` never imports mlx; a crash here costs the doctor one check). It
chooses the BLAS as a worker does, before mlx loads, loads the model as the worker does, runs
each path (engine_paths.PATHS) and prints one JSON object on stdout; logs go to stderr."""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

from ...runtime import cpus as cpu_shares
from ...runtime.blas import ActiveBlas, activate


def device_info(mx: Any) -> dict[str, Any]:
    """MLX's device and, on Metal, its name, memory and recommended working set."""
    info: dict[str, Any] = {"default_device": str(mx.default_device()), "metal": bool(mx.metal.is_available())}
    read = getattr(mx, "device_info", None) or mx.metal.device_info  # device_info moved out of mx.metal in 0.29
    try:
        info.update({k: v for k, v in read().items() if isinstance(v, (int, float, str))})
    except Exception as exc:  # a device that cannot say is not a self-test failure
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def run(spec: str, state_dir: Path, active: ActiveBlas, paths: list[str]) -> dict[str, Any]:
    """The whole self-test as data: what ran where, each path's verdict."""
    out: dict[str, Any] = {"model": spec}
    import mlx.core as mx  # after the BLAS: the engine's products must reach the one chosen

    from ..loading.blas_check import confirm
    from ..loading.loader import load_model
    from .engine_paths import SelfTest

    out["blas"] = confirm(active).as_dict()
    out["device"] = device_info(mx)
    started = time.perf_counter()
    try:
        loaded = load_model(spec, state_dir)
    except Exception as exc:  # a model that does not load is the self-test's failure, named so
        out["error"] = f"cannot load {spec}: {type(exc).__name__}: {exc}"
        return out
    out["load_s"] = round(time.perf_counter() - started, 3)
    started = time.perf_counter()
    test = SelfTest(loaded.model, loaded.tokenizer.encode, str(loaded.path))
    out.update(
        precision=test.precision,
        prefix_cache=test.kind,
        rounding=test.rounding,
        kv_rounding=test.kv_rounding,
        reference_s=round(time.perf_counter() - started, 3),
    )
    out["paths"] = [test.run(name).as_dict() for name in paths]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vllmmlxd.engine.selftest")
    parser.add_argument("--model", default="builtin:tiny", help="a builtin, a store name or a path")
    parser.add_argument("--state-dir", type=Path, required=True, help="where builtins are built and models kept")
    parser.add_argument("--blas", default="auto", help="the BLAS library on Linux (as an entry's blas:)")
    parser.add_argument("--paths", help="the paths to run, comma-separated (default: all)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    threads = cpu_shares.default_threads(len(cpu_shares.available_cpus()))
    active = activate(args.blas, threads, memo_dir=args.state_dir / "blas")  # before anything imports mlx
    from .engine_paths import PATHS

    paths = args.paths.split(",") if args.paths else list(PATHS)
    unknown = set(paths) - set(PATHS)
    if unknown:
        parser.error(f"unknown paths {sorted(unknown)}; known: {', '.join(PATHS)}")
    print(json.dumps(run(args.model, args.state_dir, active, paths)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
