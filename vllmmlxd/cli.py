"""The ``vllmmlxd`` command: ``serve`` one model by hand, or ``run`` the daemon on a config file."""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .config.entries import IMAGE_FIELDS
from .config.schema import REASONING_PARSERS, TOOL_PARSERS
from .config.speculative import SPECULATIVE_METHODS
from .log import setup_logging

if TYPE_CHECKING:
    from pydantic import ValidationError

    from .config.schema import ResolvedModel


def _names(text: str) -> tuple[str, ...]:
    """A comma-separated flag value as a tuple of names."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


def _serve_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    p = sub.add_parser("serve", help="serve one model in the foreground (no daemon)")
    p.add_argument("model", help="builtin:NAME, a .gguf path, an MLX folder or a Hugging Face repo id")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--served-model-name", help="the name clients see (default: the model spec)")
    p.add_argument("--owned-by", default="vllmmlxd")
    p.add_argument(
        "--api-key",
        help="require this key as a Bearer token or x-api-key (visible in ps: prefer "
        "--api-key-file or $VLLMMLXD_API_KEY)",
    )
    p.add_argument("--api-key-file", help="read the key from this file (its first line)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds before a request is ended")
    # No defaults here: the entry's own apply, so that a lower cap alone lowers the default too.
    p.add_argument(
        "--max-tokens", type=int, help="max_tokens when a request gives none (default 32768, at most the cap)"
    )
    p.add_argument(
        "--max-request-tokens",
        type=int,
        help="the cap on max_tokens: a request asking more gets this many (default 32768, or --max-tokens)",
    )
    p.add_argument("--default-temperature", type=float)
    p.add_argument("--default-top-p", type=float)
    p.add_argument("--stream-interval", type=int, default=1, help="tokens per streamed chunk")
    p.add_argument("--max-queue", type=int, default=64, help="requests that may wait before 503")
    p.add_argument("--max-connections", type=int, default=256, help="open connections at most; more get 503")
    p.add_argument(
        "--allowed-hosts",
        type=_names,
        default=(),
        metavar="NAME,...",
        help="Host names to answer under besides the bind address and localhost (DNS rebinding guard)",
    )
    p.add_argument(
        "--cors-origins",
        type=_names,
        default=(),
        metavar="ORIGIN,...",
        help="web origins (https://app.example) allowed to call the API from a browser; default none",
    )
    p.add_argument("--state-dir", help="caches and converted models (default: $VLLMMLXD_STATE_DIR or the platform's)")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    p.add_argument("--rate-limit", type=int, default=0, help="requests per minute per client (0: off)")
    p.add_argument("--enable-metrics", action="store_true", help="serve Prometheus metrics on /metrics")
    p.add_argument(
        "--blas",
        default="auto",
        help="Linux: the BLAS for float32 products: auto, mkl, blis, openblas, bundled or a library path",
    )
    p.add_argument(
        "--threads",
        type=int,
        help="BLAS threads (default: one fewer than the cores this process may use, at least one)",
    )
    p.add_argument(
        "--continuous-batching",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="decode concurrent requests together (default); --no-continuous-batching: one at a time",
    )
    p.add_argument("--max-num-seqs", type=int, default=16, help="requests decoded together at most")
    p.add_argument("--prefill-step-size", type=int, default=512, help="prompt tokens prefilled per step at most")
    p.add_argument("--cache-memory-mb", type=int, help="prefix cache budget in MB (0: no prefix cache)")
    p.add_argument(
        "--cache-memory-percent",
        type=float,
        default=0.20,
        help="prefix cache budget as a fraction of memory, when --cache-memory-mb is not given",
    )
    p.add_argument(
        "--max-kv-memory-mb",
        type=float,
        help="KV cache of running requests in MB at most: requests wait for room, one that never fits gets 400 "
        "(default: what is left after the weights, the prefix cache and a margin)",
    )
    p.add_argument(
        "--use-paged-cache",
        action=argparse.BooleanOptionalAction,
        help="the prefix cache holds KV in 32-token blocks, a shared start held once (default); "
        "--no-use-paged-cache: one copy of each whole sequence",
    )
    p.add_argument(
        "--cache-disk-dir",
        metavar="DIR",
        help="write the prefix cache's blocks to disk too, here (off unless this or --cache-disk-budget-gb is given)",
    )
    p.add_argument(
        "--cache-disk-budget-gb",
        type=float,
        metavar="GB",
        help="the disk tier's budget for this model (default 20; alone: in the state directory's kv-cache/)",
    )
    p.add_argument("--kv-bits", type=int, choices=(4, 8), help="the prefix cache holds KV quantized to this many bits")
    p.add_argument("--kv-group-size", type=int, choices=(32, 64, 128), help="--kv-bits: values per scale (default 64)")
    # Later features: accepted as flags so the config's validation refuses them with a clear message.
    p.add_argument(
        "--enable-auto-tool-choice",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="read the model's own tool calls out of its answers (default: on)",
    )
    p.add_argument(
        "--tool-call-parser",
        choices=TOOL_PARSERS,
        default="auto",
        help="the model's tool-call format (default: auto, from its chat template)",
    )
    p.add_argument(
        "--reasoning-parser",
        choices=REASONING_PARSERS,
        help="return a reasoning model's thinking apart from its answer",
    )
    p.add_argument(
        "--strict-model-name",
        action="store_true",
        help="answer 404 to a request naming another model (default: answer it as this one)",
    )
    p.add_argument(
        "--health-socket",
        metavar="PATH",
        help="also serve the daemon's private API (health with load, settings pushes) on this Unix socket",
    )
    p.add_argument(
        "--embedding-model",
        metavar="SPEC",
        help="also serve POST /v1/embeddings with this model, preloaded at start: "
        "builtin:all-minilm-l6-v2 or a local BERT sentence-transformers folder",
    )
    p.add_argument(
        "--mcp-config",
        metavar="FILE",
        help="connect the MCP servers of this Claude-Desktop-style mcpServers JSON file (all of them); "
        "their tools are served on /v1/mcp/tools and /v1/mcp/execute",
    )
    images = p.add_argument_group("images (vision models)")
    images.add_argument("--max-images", type=int, default=16, help="images per request at most (default 16)")
    images.add_argument("--max-image-mb", type=float, default=20.0, help="an image's size at most (default 20 MB)")
    images.add_argument(
        "--max-image-pixels", type=int, default=40_000_000, help="an image's width x height at most (default 40M)"
    )
    images.add_argument(
        "--max-request-image-pixels",
        type=int,
        default=100_000_000,
        help="a request's images' width x height together at most (default 100M)",
    )
    images.add_argument(
        "--image-pixel-budget",
        type=int,
        default=200_000_000,
        help="decoded image pixels the worker holds at once, all requests together (default 200M)",
    )
    images.add_argument(
        "--allow-image-urls", action="store_true", help="fetch http(s) image URLs (default: images as data only)"
    )
    images.add_argument(
        "--allowed-image-hosts",
        nargs="*",
        default=[],
        metavar="HOST",
        help="hosts on loopback or private addresses that image URLs may be fetched from",
    )
    images.add_argument("--image-url-timeout", type=float, default=10.0, help="seconds an image fetch may take")
    spec = p.add_argument_group("speculative decoding (prompt lookup, adaptive, unless --speculative off)")
    spec.add_argument(
        "--speculative",
        choices=(*SPECULATIVE_METHODS, "off"),
        help="prompt-lookup (the default): drafts from each request's own prompt and output; "
        "draft: a small model drafts; off",
    )
    spec.add_argument("--num-draft", type=int, help="tokens drafted per step at most (default 4)")
    spec.add_argument("--ngram", type=int, help="prompt-lookup: tokens matched to find a draft (default 6)")
    spec.add_argument("--draft-model", metavar="SPEC", help="draft: the drafting model, of the same tokenizer")
    spec.add_argument(
        "--no-adaptive-speculation",
        dest="adaptive_speculation",
        action="store_false",
        help="every request drafts --num-draft tokens every step (default: only where it pays)",
    )
    return p


_PASSED_THROUGH = (
    "host",
    "port",
    "owned_by",
    "api_key",
    "timeout",
    "max_tokens",
    "max_request_tokens",
    "default_temperature",
    "default_top_p",
    "stream_interval",
    "max_queue",
    "rate_limit",
    "enable_metrics",
    "blas",
    "threads",
    "continuous_batching",
    "max_num_seqs",
    "prefill_step_size",
    "use_paged_cache",
    "cache_memory_mb",
    "cache_memory_percent",
    "max_kv_memory_mb",
    "kv_bits",
    "kv_group_size",
    "mcp_config",
    "reasoning_parser",
    "embedding_model",
    "enable_auto_tool_choice",
    "tool_call_parser",
    "strict_model_name",
    "max_connections",
    "allowed_hosts",
    "cors_origins",
    *IMAGE_FIELDS,
)


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


def _flag(key: str) -> str:
    return "MODEL" if key == "model" else "--" + key.replace("_", "-")


def describe_flag_errors(exc: ValidationError) -> str:
    """A ValidationError of the entry built from flags as one line naming the flags, never a value.

    A field's error is ``--max-queue: ...``; an error about the entry (no field of its own) names
    the keys it mentions as their flags."""
    flagged = re.compile(r"\b(" + "|".join(("served_model_name", *_PASSED_THROUGH)) + r")\b")
    problems = []
    for e in exc.errors(include_input=False, include_url=False):
        message = e["msg"].removeprefix("Value error, ")
        loc = e["loc"]
        if loc:  # a field of the speculative section is a flag of its own (--num-draft)
            problems.append(f"{_flag(str(loc[1] if loc[0] == 'speculative' and len(loc) > 1 else loc[0]))}: {message}")
        else:
            problems.append(flagged.sub(lambda m: _flag(m[1]), message))
    return "; ".join(problems)


def serve_config(args: argparse.Namespace) -> ResolvedModel:
    """The ResolvedModel ``vllmmlxd serve`` runs: the flags given, the entry's defaults for the rest."""
    from .config.schema import ResolvedModel

    given = {key: getattr(args, key) for key in _PASSED_THROUGH if getattr(args, key) is not None}
    if args.cache_disk_dir is not None or args.cache_disk_budget_gb is not None:
        disk = {"dir": args.cache_disk_dir, "budget_gb": args.cache_disk_budget_gb}
        given["cache_disk"] = {k: v for k, v in disk.items() if v is not None}
    chosen = {
        "num_draft": args.num_draft,
        "ngram": args.ngram,
        "draft_model": args.draft_model,
        "adaptive": None if args.adaptive_speculation else False,
    }
    if args.speculative == "off":
        given["speculative"] = False
    elif args.speculative or any(v is not None for v in chosen.values()):
        method = args.speculative or "prompt-lookup"
        given["speculative"] = {"method": method, **{k: v for k, v in chosen.items() if v is not None}}
    return ResolvedModel(model=args.model, served_model_name=args.served_model_name or args.model, **given)


def _run_serve(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from .runtime import import_memo

    import_memo.install()  # before anything imports transformers: a second off every start
    from pydantic import ValidationError

    from .paths import resolve_state_dir
    from .worker.main import serve

    args.api_key = _api_key(args, parser)
    if args.speculative == "off" and (
        args.num_draft or args.ngram or args.draft_model or not args.adaptive_speculation
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
