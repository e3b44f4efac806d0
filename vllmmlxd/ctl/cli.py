"""``vllmmlxctl``: ask the running daemon for status, reloads, restarts and logs.

Kept quick to start: it imports httpx and the wire models, never fastapi, uvicorn
or mlx. A table for people, ``--json`` for scripts; exit codes in ``exit_codes``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path

from vllmmlxd.ctl import doctor, exit_codes
from vllmmlxd.ctl.client import (
    ControlClient,
    ControlRequestError,
    DaemonUnreachable,
    resolve_socket,
    socket_origin,
    unreachable_hint,
)
from vllmmlxd.ctl.progress import PullProgress
from vllmmlxd.ctl.render import (
    all_ready,
    render_action,
    render_check,
    render_check_refused,
    render_models,
    render_pull_end,
    render_reload,
    render_status,
)
from vllmmlxd.ctl.render_usage import period, render_usage
from vllmmlxd.errors import VllmmlxdError
from vllmmlxd.version import VersionAction

PROG = "vllmmlxctl"


def _client(args: argparse.Namespace) -> ControlClient:
    return ControlClient(resolve_socket(getattr(args, "socket", None), getattr(args, "config", None)))


def _err(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr)


def cmd_status(args: argparse.Namespace) -> int:
    """The model table (or ``--json``); 0 when every model is ready, 3 when not."""
    with _client(args) as client:
        status = client.status()
    if args.json:
        print(json.dumps(status.model_dump(mode="json"), indent=2))
    else:
        print(render_status(status))
    return exit_codes.OK if all_ready(status) else exit_codes.NOT_READY


def cmd_reload(args: argparse.Namespace) -> int:
    """Re-read the config (or, with ``--dry-run [FILE]``, only show what it, or FILE, would change)."""
    file = getattr(args, "file", None)
    if file and not args.dry_run:
        _err(
            "FILE needs --dry-run: a reload always reads the daemon's own config file "
            "(edit that file, or restart the daemon with --config FILE)"
        )
        return exit_codes.USAGE
    if file:
        file = str(Path(file).expanduser().resolve())  # the daemon's working directory is not ours
        if not Path(file).is_file():
            _err(f"{file}: no such file")
            return exit_codes.ERROR
    with _client(args) as client:
        result = client.reload(dry_run=args.dry_run, file=file)
    read = getattr(result, "config_path", None)
    about_file = read == file or (
        not result.ok and bool(file) and str(file) in (result.error or "")
    )  # FILE:LINE:COL errors name it
    if file and not about_file:
        # A daemon that does not know the file parameter previews its own config instead.
        _err(
            f"this daemon cannot preview another file (it read {read or 'its own config'}); "
            f"copy {file} over its config and run `vllmmlxctl reload --dry-run`"
        )
        return exit_codes.ERROR
    print(render_reload(result), file=sys.stdout if result.ok else sys.stderr)
    return exit_codes.OK if result.ok else exit_codes.ERROR


def cmd_action(args: argparse.Namespace) -> int:
    """``restart``, ``stop`` or ``start`` one model."""
    with _client(args) as client:
        result = client.action(args.model, args.command)
    print(render_action(args.command, result), file=sys.stdout if result.ok else sys.stderr)
    return exit_codes.OK if result.ok else exit_codes.ERROR


def cmd_logs(args: argparse.Namespace) -> int:
    """Print a model's recent stderr lines; ``-f`` keeps printing new ones until Ctrl-C."""
    with _client(args) as client:
        if not args.follow:
            for line in client.logs(args.model, args.lines):
                print(line)
            return exit_codes.OK
        try:
            for line in client.follow(args.model, args.lines):
                print(line, flush=True)
        except KeyboardInterrupt:
            pass
    return exit_codes.OK


def cmd_pull(args: argparse.Namespace) -> int:
    """Have the daemon pull a model into its store and follow it (a bar on a terminal, plain lines
    elsewhere, ``--json``: each status as a JSON line); 0 once it is in the store. Ctrl-C stops
    following, not the pull; ``--cancel`` stops the pull."""
    with _client(args) as client:
        if args.cancel:
            return _cancel_pull(client, args.source)
        started = time.monotonic()
        status = client.pull(args.source, args.revision)
        progress = PullProgress(sys.stdout, sys.stdout.isatty(), shutil.get_terminal_size().columns)
        try:
            for update in client.follow_pull(status.id):
                status = update  # the last one is how the pull ended
                if args.json:
                    print(update.model_dump_json(), flush=True)
                else:
                    progress.show(update)
        except KeyboardInterrupt:
            progress.close()
            _err(
                f"stopped following: the daemon goes on pulling {status.repo} "
                f"(`vllmmlxctl pull {status.repo}` follows it again, `vllmmlxctl pull --cancel {status.repo}` stops it)"
            )
            return 130
        progress.close()
    if not args.json:
        done = status.state == "done"
        print(render_pull_end(status, time.monotonic() - started), file=sys.stdout if done else sys.stderr)
    return exit_codes.OK if status.state == "done" else exit_codes.ERROR


def _cancel_pull(client: ControlClient, source: str) -> int:
    """``pull --cancel REPO_OR_ID``: stop the pull of that repo under way."""
    running = [p for p in client.pulls() if p.state not in ("done", "failed", "cancelled") and source in (p.id, p.repo)]
    if not running:
        _err(f"no pull of {source} is under way")
        return exit_codes.ERROR
    status = client.cancel_pull(running[0].id)
    print(render_pull_end(status))
    return exit_codes.OK


def cmd_models(args: argparse.Namespace) -> int:
    """The models in the daemon's store, their size, source and the entries that use them (or ``--json``)."""
    with _client(args) as client:
        store = client.store()
    if args.json:
        print(json.dumps(store.model_dump(mode="json"), indent=2))
    else:
        print(render_models(store))
    return exit_codes.OK


def cmd_usage(args: argparse.Namespace) -> int:
    """Each key's requests, errors and tokens per model over ``--since`` (or ``--json``), and budgets."""
    with _client(args) as client:
        report = client.usage(args.since)
    if args.json:
        print(json.dumps(report.model_dump(mode="json"), indent=2))
    else:
        print(render_usage(report))
    return exit_codes.OK


def cmd_rm(args: argparse.Namespace) -> int:
    """Delete a model from the store (refused while an entry uses it, or while it is being pulled)."""
    with _client(args) as client:
        result = client.remove(args.name)
    print(result.message)
    return exit_codes.OK


def cmd_check(args: argparse.Namespace) -> int:
    """Validate a config file without a daemon: ``FILE: ok (...)`` and its memory plan, or why it is refused."""
    from vllmmlxd.config.load import load_config
    from vllmmlxd.errors import ConfigError
    from vllmmlxd.paths import resolve_state_dir
    from vllmmlxd.store.layout import not_downloaded, pull_hint
    from vllmmlxd.supervisor.memory import load_memory_plan

    try:
        loaded = load_config(args.file)
    except ConfigError as e:
        print(e, file=sys.stderr)
        return exit_codes.ERROR
    # The plan on this machine, as the daemon would compute it at start (it reads the same files).
    state_dir = resolve_state_dir(loaded.config.daemon.state_dir)
    memory = load_memory_plan(loaded.config, state_dir)
    if not memory.fits:
        print(render_check_refused(args.file, memory.refusal()), file=sys.stderr)
        return exit_codes.ERROR
    print(render_check(args.file, list(loaded.config.models), memory.render()))
    # Models not on this machine yet: the daemon would refuse those entries, or download them.
    for name, entry in loaded.config.models.items():
        repo = not_downloaded(getattr(entry, "model", ""), state_dir)
        if repo and getattr(entry, "download", False):
            print(f"{name}: {repo} is not downloaded yet: the daemon downloads it (download: true)")
        elif repo:
            print(f"{name}: {pull_hint(repo)} (or set download: true on {name})")
    return exit_codes.OK


def service_config(args: argparse.Namespace, kind: str) -> tuple[Path, str]:
    """The config the service will run and why that one: ``--config``, else the running
    daemon's, else the default for a user (or a system) service."""
    from vllmmlxd import service_files as sf

    given = getattr(args, "config", None)
    if given:
        return Path(given).expanduser().resolve(), "given with --config"
    running = _running_config(args)
    if running:
        return Path(running), "the running daemon's"
    if args.user:
        base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        return base / "vllmmlxd" / "config.yaml", "the default for a user service"
    template = sf.TEMPLATE_SYSTEMD if kind == "systemd" else sf.TEMPLATE_LAUNCHD
    return Path(template["config"]), "the default for a system service"


def _running_config(args: argparse.Namespace) -> str | None:
    """The config file of the daemon answering on this user's socket, if one answers quickly."""
    try:
        with ControlClient(resolve_socket(getattr(args, "socket", None)), connect_timeout=0.5) as client:
            return client.status().daemon.config_path
    except (DaemonUnreachable, ControlRequestError, VllmmlxdError, ValueError):
        return None


def cmd_install_service(args: argparse.Namespace) -> int:
    """Write a systemd unit or launchd plist for this install (or ``--print`` it), then say how to enable it."""
    from vllmmlxd import service_files as sf

    kind = args.kind or sf.default_kind()
    config, why = service_config(args, kind)
    service = sf.make_service_file(kind, args.user, config)
    if not config.expanduser().exists():
        _err(f"note: {config} does not exist yet; write it before starting the service")
    for warning in sf.reach_warnings(kind, args.user, sf.service_paths(os.path.abspath(sf.default_exe()), config)):
        _err(f"warning: {warning}")
    if args.print:
        sys.stdout.write(service.content.decode())
        print(f"# it runs the config {config} ({why})", file=sys.stderr)
        print(f"# save as {service.path}, then run:", file=sys.stderr)
        for command in service.commands:
            print(f"#   {command}", file=sys.stderr)
        return exit_codes.OK
    try:
        path = sf.write_service_file(service)
    except OSError as e:
        hint = " (use --user, run it as root, or --print it)" if isinstance(e, PermissionError) else ""
        _err(f"cannot write {service.path}: {e.strerror or e}{hint}")
        return exit_codes.ERROR
    print(f"wrote {path}")
    print(f"it runs the config {config} ({why})")
    print("to start it now and at every boot, run:")
    for command in service.commands:
        print(f"  {command}")
    return exit_codes.OK


def make_parser() -> argparse.ArgumentParser:
    """The argument parser; ``--socket`` and ``--config`` work before or after the command."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a subcommand's unset option must not overwrite one given before the command.
    common.add_argument(
        "--socket",
        metavar="PATH",
        default=argparse.SUPPRESS,
        help="the daemon's control socket (default: $VLLMMLXD_SOCKET, the config's, or the state dir's)",
    )
    common.add_argument(
        "--config",
        metavar="FILE",
        default=argparse.SUPPRESS,
        help="the daemon's config file, to find its control socket",
    )
    parser = argparse.ArgumentParser(prog=PROG, parents=[common], description="Control a running vllmmlxd.")
    parser.add_argument("--version", action=VersionAction)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("status", parents=[common], help="show each model's state; exit 3 if any is not ready")
    p.add_argument("--json", action="store_true", help="print the daemon's JSON answer")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("reload", parents=[common], help="re-read the config; apply only what changed")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="show, per model, what would change (applied live or a new worker) and change nothing",
    )
    p.add_argument(
        "file",
        metavar="FILE",
        nargs="?",
        help="with --dry-run: preview this file against the running config instead of the daemon's own",
    )
    p.set_defaults(func=cmd_reload)

    p = sub.add_parser("check", help="validate a config file (no daemon needed)")
    p.add_argument("file", metavar="FILE")
    p.set_defaults(func=cmd_check)

    for verb, text in (("restart", "restart"), ("stop", "stop (until start or reload)"), ("start", "start")):
        p = sub.add_parser(verb, parents=[common], help=f"{text} one model's worker")
        p.add_argument("model", metavar="MODEL")
        p.set_defaults(func=cmd_action)

    p = sub.add_parser("logs", parents=[common], help="print a model's recent worker output")
    p.add_argument("model", metavar="MODEL")
    p.add_argument("-n", "--lines", type=int, default=50, metavar="N", help="how many recent lines (default 50)")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new lines until Ctrl-C")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser(
        "pull", parents=[common], help="download a model (a Hugging Face repo's MLX folder) into the daemon's store"
    )
    p.add_argument(
        "source", metavar="REPO_OR_URL", help="org/name, or its page's URL (https://huggingface.co/org/name)"
    )
    p.add_argument("--revision", metavar="R", help="a branch, tag or commit (default: the repo's default branch)")
    p.add_argument("--json", action="store_true", help="print each status of the pull as a JSON line")
    p.add_argument("--cancel", action="store_true", help="stop the pull of REPO under way (its finished files stay)")
    p.set_defaults(func=cmd_pull)

    p = sub.add_parser("models", parents=[common], help="list the models in the store, their size and users")
    p.add_argument("--json", action="store_true", help="print the daemon's JSON answer")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("usage", parents=[common], help="each key's requests and tokens per model, and its budget")
    p.add_argument("--since", type=period, default=86_400.0, metavar="PERIOD", help="30m, 1h, 1d, 7d (default 1d)")
    p.add_argument("--json", action="store_true", help="print the daemon's JSON answer")
    p.set_defaults(func=cmd_usage)

    p = sub.add_parser("rm", parents=[common], help="delete a model from the store (refused while an entry uses it)")
    p.add_argument("name", metavar="NAME", help="as `vllmmlxctl models` names it (org/name, builtin:tiny, gguf-...)")
    p.set_defaults(func=cmd_rm)

    doctor.add_parser(sub, common)

    p = sub.add_parser("install-service", parents=[common], help="write a systemd unit or launchd plist")
    kind = p.add_mutually_exclusive_group()
    kind.add_argument("--systemd", dest="kind", action="store_const", const="systemd")
    kind.add_argument("--launchd", dest="kind", action="store_const", const="launchd")
    p.add_argument("--user", action="store_true", help="a per-user service instead of a system one")
    p.add_argument("--print", action="store_true", help="print the file instead of writing it")
    p.set_defaults(func=cmd_install_service)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one ``vllmmlxctl`` command; returns its exit code."""
    args = make_parser().parse_args(argv)
    if getattr(args, "lines", 0) < 0:
        _err("-n must be 0 or more")
        return exit_codes.USAGE
    try:
        return args.func(args)
    except DaemonUnreachable as e:
        _err(str(e))
        origin = socket_origin(getattr(args, "socket", None), getattr(args, "config", None))
        _err(f"(that socket is {origin}) {unreachable_hint(origin)}")
        return exit_codes.UNREACHABLE
    except (ControlRequestError, VllmmlxdError) as e:
        _err(str(e))
        return exit_codes.ERROR
    except BrokenPipeError:
        # `vllmmlxctl logs x | head`: the reader left. Point stdout at /dev/null so the
        # interpreter's final flush does not complain too.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exit_codes.OK
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
