"""The ``vllmmlxd`` command: ``serve`` one model by hand, or ``run`` the daemon on a config file."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .config.flags import OWN_FLAGS, add_flags, entry_values, flag_name, serve_flags
from .config.speculative import OFF
from .log import setup_logging
from .version import VersionAction

if TYPE_CHECKING:
    from pydantic import ValidationError

    from .config.schema import ResolvedModel

# `vllmmlxd serve`'s flags that are keys of the model entry.
SERVE_FLAGS = serve_flags()


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="serve one model in the foreground (no daemon)")
    p.add_argument("model", help="builtin:NAME, a .gguf path, an MLX folder or a Hugging Face repo id")
    p.add_argument(
        "--api-key",
        help="require this key as a Bearer token or x-api-key (visible in ps: prefer "
        "--api-key-file or $VLLMMLXD_API_KEY)",
    )
    p.add_argument("--api-key-file", help="read the key from this file (its first line)")
    p.add_argument("--state-dir", help="caches and converted models (default: $VLLMMLXD_STATE_DIR or the platform's)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument(
        "--health-socket",
        metavar="PATH",
        help="also serve the daemon's private API (health with load, settings pushes) on this Unix socket",
    )
    # Every other flag is a key of the model entry, made from its schema (config/flags.py).
    add_flags(p, SERVE_FLAGS)
    return p


def _api_key(args: argparse.Namespace, parser: argparse.ArgumentParser) -> str | None:
    """The key from --api-key, --api-key-file or $VLLMMLXD_API_KEY (one of them at most)."""
    given = [
        name
        for name, value in (
            ("--api-key", args.api_key),
            ("--api-key-file", args.api_key_file),
            ("$VLLMMLXD_API_KEY", os.environ.get("VLLMMLXD_API_KEY")),
        )
        if value
    ]
    if len(given) > 1:
        parser.error(f"give the API key one way, not {' and '.join(given)}")
    if args.api_key_file:
        try:
            key = Path(args.api_key_file).expanduser().read_text().strip().splitlines()[0:1]
        except OSError as exc:
            parser.error(f"--api-key-file: cannot read {args.api_key_file}: {exc.strerror}")
        if not key or not key[0].strip():
            parser.error(f"--api-key-file: {args.api_key_file} is empty")
        return key[0].strip()
    return args.api_key or os.environ.get("VLLMMLXD_API_KEY") or None


def describe_flag_errors(exc: ValidationError) -> str:
    """A ValidationError of the entry built from flags as one line naming the flags, never a value.

    A field's error is ``--max-queue: ...``; an error about the entry (no field of its own) names
    the keys it mentions as their flags."""
    # "model" is left as it is: the word is in messages about other things too.
    keys = [f.key for f in SERVE_FLAGS if "." not in f.key] + [k for k in OWN_FLAGS if k != "model"]
    flagged = re.compile(r"\b(" + "|".join(keys) + r")\b")
    problems = []
    for e in exc.errors(include_input=False, include_url=False):
        message = e["msg"].removeprefix("Value error, ")
        if e["loc"]:
            problems.append(f"{flag_name(e['loc'], SERVE_FLAGS)}: {message}")
        else:
            problems.append(flagged.sub(lambda m: flag_name((m[1],), SERVE_FLAGS), message))
    return "; ".join(problems)


def serve_config(args: argparse.Namespace) -> ResolvedModel:
    """The ResolvedModel ``vllmmlxd serve`` runs: the flags given, the entry's defaults for the rest."""
    from .config.schema import ResolvedModel

    given = entry_values(args, SERVE_FLAGS)
    if args.api_key is not None:
        given["api_key"] = args.api_key
    return ResolvedModel(
        model=args.model, **{**given, "served_model_name": given.get("served_model_name") or args.model}
    )


def _run_serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .runtime import import_memo

    import_memo.install()  # before anything imports transformers: a second off every start
    from pydantic import ValidationError

    from .paths import resolve_state_dir
    from .worker.main import serve

    args.api_key = _api_key(args, parser)
    if args.speculative_method == OFF and any(
        getattr(args, f.dest) is not None for f in SERVE_FLAGS if f.key.startswith("speculative.") and not f.turns_off
    ):
        parser.error(
            "--num-draft, --ngram, --draft-model and --no-adaptive-speculation do not go with --speculative off"
        )
    try:
        config = serve_config(args)
    except ValidationError as exc:
        print(f"{parser.prog}: error: {describe_flag_errors(exc)}", file=sys.stderr)
        return 2
    setup_logging(args.log_level)
    from pathlib import Path

    health_socket = Path(args.health_socket) if args.health_socket else None
    return serve(
        config,
        "default",
        state_dir=resolve_state_dir(args.state_dir),
        log_level=args.log_level,
        health_socket=health_socket,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="vllmmlxd", description="Serve local LLMs with MLX.")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True)
    serve_parser = _serve_parser(sub)
    run_parser = sub.add_parser("run", help="run the daemon: one supervised worker per model entry of a config file")
    run_parser.add_argument(
        "--config", "-c", required=True, help="the YAML config file (see config/vllmmlxd.example.yaml)"
    )
    run_parser.add_argument("--state-dir", help="overrides daemon.state_dir and $VLLMMLXD_STATE_DIR")
    args = parser.parse_args(argv)
    if args.command == "serve":
        code = _run_serve(args, serve_parser)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # as in worker/__main__.py: MLX's threads must not see interpreter teardown
    from .daemon import run

    return run(args.config, args.state_dir)


if __name__ == "__main__":
    sys.exit(main())
