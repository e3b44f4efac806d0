"""render.py: the status table, its footer and the one-line summaries, as exact text."""

from __future__ import annotations

import time

import pytest

from vllmmlxd.control.protocol import (
    ActionResponse,
    DaemonStatus,
    ModelStatus,
    ReloadResponse,
    ReloadResult,
    StatusResponse,
)
from vllmmlxd.ctl.render import (
    all_ready,
    format_clock,
    format_duration,
    render_action,
    render_check,
    render_check_refused,
    render_reload,
    render_status,
    render_table,
)

AT = time.mktime((2024, 5, 1, 12, 3, 4, 0, 0, -1))  # local 2024-05-01 12:03:04


def model(name: str, state: str = "ready", **kw) -> ModelStatus:
    fields = dict(pid=4200, host="127.0.0.1", port=8001, restarts=0, uptime_s=192.0, served_model_name=name)
    fields.update(kw)
    return ModelStatus(name=name, state=state, **fields)


def status(*models: ModelStatus, reload: ReloadResult | None = None) -> StatusResponse:
    daemon = DaemonStatus(
        pid=4121,
        uptime_s=3700,
        config_path="/etc/v.yaml",
        config_hash="abcdef0123456789",
        last_reload=reload,
        version="0.1.0",
    )
    return StatusResponse(daemon=daemon, models=list(models))


@pytest.mark.parametrize(
    "seconds, text",
    [
        (None, "-"),
        (0, "0s"),
        (59.9, "59s"),
        (60, "1m00s"),
        (192, "3m12s"),
        (3600, "1h00m"),
        (7500, "2h05m"),
        (86400 * 3 + 3600 * 4, "3d04h"),
        (-5, "0s"),
    ],
)
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text


def test_format_clock_shows_the_date_only_for_another_day():
    assert format_clock(AT, now=AT + 60) == "12:03:04"
    assert format_clock(AT, now=AT + 86400 * 2) == "2024-05-01 12:03:04"


def test_table_pads_columns_and_strips_trailing_spaces():
    assert render_table(("A", "BB"), [("xyz", "1"), ("q", "")]) == "A    BB\nxyz  1\nq"


def test_status_table_and_footer():
    text = render_status(
        status(
            model("llama", keys=["alice", "ci"]),
            model("qwen", "starting", pid=None, port=8002, uptime_s=None, restarts=2),
            reload=ReloadResult(ok=True, at=AT),
        ),
        now=AT,
    )
    assert text == (
        "MODEL  STATE     PID   PORT  KEYS      UPTIME  RESTARTS  RUN  WAIT  TOK/S  CACHE  BLAS  THREADS  CPUS\n"
        "llama  ready     4200  8001  alice,ci  3m12s   0         -    -     -      -      -     -        -\n"
        "qwen   starting  -     8002  open      -       2         -    -     -      -      -     -        -\n"
        "\n"
        "daemon: pid 4121, up 1h01m, version 0.1.0, config /etc/v.yaml (abcdef012345)\n"
        "last reload: ok at 12:03:04"
    )


def test_load_columns():
    busy = model("llama", running=3, waiting=1, tokens_per_s=41.5, cache_mb=12.3, cache_budget_mb=4821.0)
    header, row = render_status(status(busy), now=AT).splitlines()[:2]
    cells = dict(zip(header.split(), row.split()))
    assert (cells["RUN"], cells["WAIT"], cells["TOK/S"], cells["CACHE"]) == ("3", "1", "41.5", "12.3/4821M")
    disk = model("llama", cache_mb=12.3, cache_budget_mb=4821.0, cache_disk_mb=1300.0, cache_disk_budget_mb=20480.0)
    header, row = render_status(status(disk), now=AT).splitlines()[:2]
    assert dict(zip(header.split(), row.split()))["CACHE"] == "12.3/4821M+1.27/20G"  # and its disk tier


def test_blas_columns_and_the_libraries_beneath():
    mkl = dict(blas="mkl", blas_path="/venv/lib/libmkl_rt.so.3", threads=1)
    fell_back = dict(
        blas="bundled",
        blas_path="/venv/mlx_cpu.libs/libblas.so",
        threads=1,
        cpus="1",
        blas_warning="/opt/x.so: no such file",
    )
    text = render_status(status(model("llama", cpus="0", **mkl), model("qwen", port=8002, **fell_back)), now=AT)
    lines = text.splitlines()
    assert lines[0].split()[-3:] == ["BLAS", "THREADS", "CPUS"]
    assert lines[1].split()[-3:] == ["mkl", "1", "0"]
    assert lines[2].split()[-3:] == ["bundled", "1", "1"]
    assert lines[4:7] == [
        "blas bundled: /venv/mlx_cpu.libs/libblas.so",
        "blas mkl: /venv/lib/libmkl_rt.so.3",
        "qwen: /opt/x.so: no such file",
    ]


def test_failed_models_show_their_last_lines_indented():
    failed = model(
        "qwen",
        "failed",
        pid=None,
        uptime_s=None,
        last_exit_code=1,
        last_error="Traceback (most recent call last):\nMemoryError: out of memory",
    )
    text = render_status(status(model("llama"), failed), now=AT)
    assert "\nqwen failed (exit 1):\n    Traceback (most recent call last):\n    MemoryError: out of memory\n" in text
    assert "llama ready" not in text  # only failed models get an explanation
    assert text.endswith("last reload: none")


def test_failed_reload_footer_puts_the_first_error_line_inline():
    reload = ReloadResult(ok=False, at=AT, error="c.yaml:3:11: models.a.port: bad\nc.yaml:7:3: models.b: unknown key")
    text = render_status(status(model("a"), reload=reload), now=AT)
    assert text.endswith(
        "last reload: FAILED at 12:03:04: c.yaml:3:11: models.a.port: bad\n    c.yaml:7:3: models.b: unknown key"
    )


def test_no_models():
    assert render_status(status(), now=AT).startswith("no models\n")


def test_all_ready():
    assert all_ready(status(model("a"), model("b")))
    assert all_ready(status())
    assert not all_ready(status(model("a"), model("b", "backoff")))


def test_render_reload():
    plan = "added: b\nunchanged: a"
    assert (
        render_reload(ReloadResponse(ok=True, dry_run=False, plan=plan)) == "reloaded:\n    added: b\n    unchanged: a"
    )
    assert render_reload(ReloadResponse(ok=True, dry_run=True, plan=plan)).startswith("would apply:\n    added: b")
    failed = render_reload(ReloadResponse(ok=False, dry_run=False, plan="", error="c.yaml:3:11: models.a.port: bad"))
    assert failed == "reload failed; the daemon keeps its previous config:\nc.yaml:3:11: models.a.port: bad"
    late = render_reload(ReloadResponse(ok=False, dry_run=False, plan="added: b", error="b: did not become ready"))
    assert late.endswith("b: did not become ready\nplan:\n    added: b")
    refused = render_reload(
        ReloadResponse(
            ok=False,
            dry_run=True,
            plan="changed: a (port)\nmemory: 9 MB needed",
            error="not enough memory: the models need 9 MB",
        )
    )
    assert refused == (
        "the reload would fail; nothing changed:\nnot enough memory: the models need 9 MB\n"
        "plan:\n    changed: a (port)\n    memory: 9 MB needed"
    )


def test_render_action_and_check():
    assert render_action("restart", ActionResponse(ok=True, name="a", message="restarted")) == "a: restarted"
    assert render_action("start", ActionResponse(ok=False, name="a", message="did not become ready")) == (
        "start a failed: did not become ready"
    )
    assert render_check("c.yaml", ["a", "b"]) == "c.yaml: ok (2 models: a, b)"
    assert render_check("c.yaml", ["a"]) == "c.yaml: ok (1 model: a)"
    assert render_check("c.yaml", []) == "c.yaml: ok (0 models)"
    assert render_check("c.yaml", ["a"], "memory: 300 MB needed\n  a: 300 MB") == (
        "c.yaml: ok (1 model: a)\nmemory: 300 MB needed\n  a: 300 MB"
    )
    assert render_check_refused("c.yaml", "not enough memory: ...") == "c.yaml: refused: not enough memory: ..."


def test_a_deleted_config_file_is_said_in_the_footer():
    s = status(model("llama"))
    assert "MISSING" not in render_status(s, now=AT)
    missing = s.model_copy(update={"daemon": s.daemon.model_copy(update={"config_missing": True})})
    assert "config file MISSING: /etc/v.yaml was deleted" in render_status(missing, now=AT)


def test_lazy_idle_unloaded_upstream_and_the_gateway_read_plainly():
    from vllmmlxd.control.protocol import GatewayStatus

    s = status(
        model("llama"),
        model("qwen", "idle", load="lazy", idle_unload_s=900, idle_s=42),
        model("mistral", "unloaded", pid=None, load="lazy"),
        model("far", "unreachable", pid=None, upstream="http://studio-2.local:8001", last_error="cannot reach it"),
    )
    s.gateway = GatewayStatus(state="ready", pid=77, host="127.0.0.1", port=8080, ui=True)
    text = render_status(s)
    assert "idle 42s" in text and "unreachable*" in text
    assert "qwen: lazy (loads on its first request through the gateway), unloaded after 15m00s idle" in text
    assert "far*: served by http://studio-2.local:8001" in text
    assert "far unreachable:\n    cannot reach it" in text
    assert "gateway: ready, pid 77, http://127.0.0.1:8080/  (web page at /), restarts 0" in text
    assert not all_ready(s)  # the upstream is unreachable
    s.models.pop()
    assert all_ready(s)  # idle and unloaded lazy models serve (on demand)
    s.gateway = GatewayStatus(state="failed", host="127.0.0.1", port=8080, last_error="boom")
    assert not all_ready(
        s
    ) and "gateway: failed, http://127.0.0.1:8080/  (web page at /), restarts 0\n    boom" in render_status(s)


def test_a_dry_run_with_entries_says_each_thing_once():
    from vllmmlxd.config.diff import diff_models
    from vllmmlxd.config.schema import Config, ModelConfig

    def config(**models):
        return Config(models={n: ModelConfig(model="builtin:tiny", port=p) for n, p in models.items()})

    def answer(old, new):
        plan = diff_models(old, new)  # as the daemon sends it: its text with details, and the entries
        return ReloadResponse(
            ok=True,
            dry_run=True,
            plan=f"{plan.render()}\nmemory: 300 MB needed\n  default: 300 MB",
            entries=plan.entries(),
            config_path="/etc/v.yaml",
        )

    same = render_reload(answer(config(default=8000), config(default=8000)))
    assert same == (
        "would apply /etc/v.yaml:\n    no changes\n    unchanged: default\n"
        "    memory: 300 MB needed\n      default: 300 MB"
    )
    moved = render_reload(answer(config(default=8000, b=8001), config(default=8002, b=8001, c=8003)))
    assert moved.count("unchanged: b") == 1 and "new worker  port" in moved and "added: c" in moved


def test_replica_sets_get_a_group_column_and_a_line_with_their_members_states_and_load():
    from vllmmlxd.control.protocol import GroupStatus

    s = status(
        model("a", group="tiny", running=2, waiting=1),
        model("b", "backoff", pid=None, port=8002, group="tiny"),
        model("solo", port=8003),
    )
    s.groups = [
        GroupStatus(
            name="tiny",
            state="ready",
            members=[
                {"name": "a", "state": "ready", "running": 2, "waiting": 1},
                {"name": "b", "state": "backoff"},
            ],
        )
    ]
    lines = render_status(s, now=AT).splitlines()
    header = lines[0].split()
    assert header[:3] == ["MODEL", "GROUP", "STATE"]
    assert [line.split()[:3] for line in lines[1:4]] == [
        ["a", "tiny", "ready"],
        ["b", "tiny", "backoff"],
        ["solo", "-", "ready"],
    ]
    assert "group tiny: ready; a ready (2 running, 1 waiting), b backoff" in lines
    # Without a group, the table is as it always was.
    assert "GROUP" not in render_status(status(model("solo")), now=AT)


def test_a_distributed_entry_gets_its_split_and_a_line_per_rank():
    """``NAME: pipeline over 2 ranks (ring)``, then each rank: host, pid, state, share, step/wait times."""
    from vllmmlxd.control.protocol import RankStatus

    s = status(
        model(
            "big",
            distributed={"backend": "ring", "parallel": "pipeline", "world": 2},
            ranks=[
                RankStatus(rank=0, host="127.0.0.1", pid=4200, state="ready", share="layers 0-14 of 30", step_ms=12.5),
                RankStatus(
                    rank=1,
                    host="studio-2.local",
                    pid=None,
                    state="starting",
                    share="layers 15-29 of 30",
                    step_ms=11.0,
                    wait_ms=0.75,
                ),
            ],
        ),
        model("solo", port=8002),
    )
    lines = render_status(s, now=AT).splitlines()
    at = lines.index("big: pipeline over 2 ranks (ring)")
    assert lines[at + 1 : at + 3] == [
        "  rank 0  127.0.0.1  pid 4200  ready  layers 0-14 of 30  (step 12.5 ms)",
        "  rank 1  studio-2.local  pid -  starting  layers 15-29 of 30  (step 11 ms, wait 0.75 ms)",
    ]
    assert not any(line.startswith("solo:") for line in lines)  # one process: no rank lines
    assert "ranks (" not in render_status(status(model("solo")), now=AT)


def test_vision_models_are_named_beneath_the_table():
    out = render_status(status(model("eyes", vision=True), model("words")))
    assert "vision (takes images): eyes" in out.splitlines()
    assert "vision" not in render_status(status(model("words")))


def test_a_speculating_entry_says_how_its_drafts_fare():
    spec = {"method": "prompt-lookup", "drafted_tokens": 1204, "accepted_tokens": 975, "acceptance_rate": 0.81}
    out = render_status(status(model("llama", speculative=spec), model("plain")))
    assert "llama speculates (prompt-lookup): 81% of 1,204 drafted tokens accepted" in out.splitlines()
    fresh = render_status(status(model("llama", speculative={**spec, "drafted_tokens": 0})))
    assert "llama speculates (prompt-lookup): nothing drafted yet" in fresh


def test_the_kv_budget_of_running_requests_beneath_the_table():
    kv = {"budget_mb": 6144.0, "reserved_mb": 5120.0, "held_mb": 900.0, "running": 2, "waiting": 6}
    out = render_status(status(model("llama", kv=kv), model("plain")))
    assert "llama KV: 5,120.0 of 6,144.0 MB reserved by 2 running, 6 waiting for room" in out.splitlines()
    calm = render_status(status(model("llama", kv={**kv, "waiting": 0})))
    assert "llama KV: 5,120.0 of 6,144.0 MB reserved by 2 running" in calm.splitlines()
    assert "KV:" not in render_status(status(model("llama", kv={**kv, "budget_mb": None})))  # no budget


def test_sizes_read_as_the_store_says_them():
    from vllmmlxd.ctl.render import format_size
    from vllmmlxd.store.disk import format_bytes

    for n in (0, 1, 999, 1000, 3400, 99_999, 12_500_000, 4_270_000_000, 15 * 10**9, 3 * 10**12, None):
        assert format_size(n) == format_bytes(n)


def test_a_pull_bar_fits_its_width_and_shows_speed_and_eta():
    from tests.support.control import pull_status
    from vllmmlxd.ctl.render import render_pull_bar

    p = pull_status("downloading", 1_480_000_000, bytes_per_s=12_500_000, eta_s=200.0)
    bar = render_pull_bar(p, 100)
    assert (
        len(bar) == 100
        and bar.startswith("org/m  [########")
        and bar.endswith(" 37.0%  1.48 GB/4.00 GB  12.5 MB/s  ETA 3m20s")
    )
    assert render_pull_bar(pull_status("verifying", 4 * 10**9), 100) == "org/m  verifying checksums"
    assert len(render_pull_bar(p, 40)) <= 40  # a narrow terminal drops the bar, not the figures' line


def test_plain_progress_lines_are_one_per_step_and_few_between():
    import io

    from tests.support.control import pull_status
    from vllmmlxd.ctl.progress import PullProgress

    now = [0.0]
    out = io.StringIO()
    progress = PullProgress(out, tty=False, clock=lambda: now[0])
    for t, status in [
        (0.0, pull_status("resolving", total_bytes=None)),
        (0.1, pull_status("downloading", 10**9)),
        (2.0, pull_status("downloading", 2 * 10**9)),  # within 5 s of the last line: not shown
        (5.2, pull_status("downloading", 3 * 10**9)),
        (5.3, pull_status("verifying", 4 * 10**9)),
        (5.4, pull_status("done", 4 * 10**9)),  # said by the caller
    ]:
        now[0] = t
        progress.show(status)
    assert out.getvalue().splitlines() == [
        "org/m: asking the hub for its files",
        "org/m: 25% of 4.00 GB",
        "org/m: 75% of 4.00 GB",
        "org/m: verifying checksums",
    ]
    tty = io.StringIO()
    bar = PullProgress(tty, tty=True, width=60)
    bar.show(pull_status("downloading", 10**9))
    bar.show(pull_status("downloading", 2 * 10**9))
    bar.close()
    assert tty.getvalue().count("\r") == 2 and tty.getvalue().endswith("\n") and "50.0%" in tty.getvalue()
