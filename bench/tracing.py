"""What tracing costs: request latency with `telemetry:` off, on (every trace kept, sent to a
collector), and on with the collector gone, side by side in one run.

    python bench/tracing.py [--requests 40] [--rounds 3] [--write docs/benchmarks.md]

One daemon serving `builtin:tiny` behind its gateway; a collector (OTLP/HTTP) in this process.
The three settings take turns by live reloads of the `telemetry:` section, `--rounds` times, each
measuring `--requests` chat requests (16 tokens, greedy) sent one after another through the
gateway with a client's `traceparent`; the table gives each setting's median and 90th-percentile
latency over all its rounds, and what the worker's `/metrics` counted as exported and dropped.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import httpx
import yaml
from common import REPO, cpu_name, publish

sys.path.insert(0, str(REPO))

from tests.support.daemon import free_port, make_daemon
from tests.support.otlp import Collector
from vllmmlxd.paths import resolve_state_dir


def config(d, telemetry: dict | None) -> str:
    body: dict = {
        "daemon": {"control_socket": str(d.socket), "state_dir": str(d.state_dir)},
        "gateway": {"port": d.gateway_port},
        "models": {"tiny": {"model": "builtin:tiny", "port": d.port, "enable_metrics": True}},
    }
    if telemetry is not None:
        body["telemetry"] = telemetry
    return yaml.safe_dump(body)


def applied(d, text: str) -> None:
    """Write the config and wait until the worker and the gateway run it (a live reload)."""
    if d.config_path.read_text() == text:
        return  # running already: an unchanged file is no reload
    before = d.status()["daemon"].get("last_reload") or {}
    d.write_text(text)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        last = d.status()["daemon"].get("last_reload") or {}
        if last != before and last.get("ok"):
            time.sleep(1.0)  # the settings reach the worker and the gateway
            return
        time.sleep(0.1)
    raise TimeoutError("the reload did not apply")


def latencies(url: str, n: int) -> list[float]:
    body = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 16, "temperature": 0}
    out = []
    with httpx.Client(timeout=60) as client:
        for _ in range(n):
            headers = {"traceparent": f"00-{os.urandom(16).hex()}-{os.urandom(8).hex()}-01"}
            started = time.perf_counter()
            r = client.post(url, json=body, headers=headers)
            out.append(time.perf_counter() - started)
            assert r.status_code == 200, r.text
    return out


def counted(port: int) -> tuple[float, float]:
    metrics = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    values = {}
    for line in metrics.splitlines():
        if line.startswith(("vllmmlxd_trace_spans_exported_total", "vllmmlxd_trace_spans_dropped_total")):
            values[line.split()[0]] = float(line.split()[-1])
    return values["vllmmlxd_trace_spans_exported_total"], values["vllmmlxd_trace_spans_dropped_total"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--write", type=Path)
    args = parser.parse_args()
    # The daemon's state directory links the models and BLAS measurements of this one (the default).
    os.environ.setdefault("VLLMMLXD_STATE_DIR", str(resolve_state_dir()))
    collector = Collector().start()
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    settings = {
        "off": None,
        "on (ratio 1.0)": {"endpoint": collector.endpoint, "sampling_ratio": 1.0},
        "on, collector down": {"endpoint": dead, "sampling_ratio": 1.0, "timeout_s": 1},
    }
    d = make_daemon()
    d.port, d.gateway_port = free_port(), free_port()
    d.write_text(config(d, None))
    d.start()
    results: dict[str, list[float]] = {name: [] for name in settings}
    try:
        d.wait_for(
            lambda ms: ms["tiny"]["state"] == "ready" and (d.status().get("gateway") or {}).get("state") == "ready",
            what="ready",
        )
        url = f"http://127.0.0.1:{d.gateway_port}/v1/chat/completions"
        latencies(url, 5)  # warm-up
        for _ in range(args.rounds):
            for name, telemetry in settings.items():
                applied(d, config(d, telemetry))
                results[name] += latencies(url, args.requests)
        exported, dropped = counted(d.port)
    finally:
        d.stop()
        collector.stop()
    import mlx.core as mx

    lines = [
        "## Tracing: latency with traces off, on, and on with the collector down (`bench/tracing.py`)",
        "",
        f"- Date: {time.strftime('%Y-%m-%d')}; command: `python bench/tracing.py`",
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_name()}, {os.cpu_count()} cores, MLX {mx.__version__} on {mx.default_device()}",
        f"- One daemon, `builtin:tiny` behind its gateway; {args.requests} chat requests (16 tokens, greedy) one after",
        f"  another with a client's `traceparent`, per setting per round, {args.rounds} rounds, the settings taking turns",
        "  by live reloads of `telemetry:`; the collector (OTLP/HTTP) runs in the bench's process",
        "",
        "| telemetry | median latency (ms) | p90 (ms) | vs off |",
        "|---|---|---|---|",
    ]
    off = statistics.median(results["off"])
    for name, values in results.items():
        median, p90 = statistics.median(values), statistics.quantiles(values, n=10)[-1]
        lines.append(f"| {name} | {median * 1000:.1f} | {p90 * 1000:.1f} | {median / off:.2f}x |")
    lines += [
        "",
        f"The worker exported {exported:,.0f} spans and dropped {dropped:,.0f} (those of the collector-down turns).",
    ]
    publish(lines, args.write)


if __name__ == "__main__":
    main()
