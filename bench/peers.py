"""Serving speed against the peer servers: vllmmlxd, mlx_lm.server and vllm-mlx on the same model folder, one run.

    python bench/peers.py [--servers ours-seq,ours-batched,mlx-lm,vllm-mlx,vllm-mlx-simple]
                          [--models random-100m,tiny] [--quick] [--write docs/benchmarks.md]
                          [--before REV]  (adds before-seq, before-batched: vllmmlxd at git REV)

Each server is started in turn as a subprocess on a free port, measured, and stopped:
- ours-seq: `vllmmlxd serve FOLDER --no-continuous-batching` (one request at a time);
- ours-batched: `vllmmlxd serve FOLDER` (with `--max-num-seqs 16` where the CLI has it);
- mlx-lm: `python -m mlx_lm server --model FOLDER` from vllmmlxd's own venv (it batches by itself);
- vllm-mlx: `vllm-mlx serve FOLDER --continuous-batching`, and vllm-mlx-simple: the same without
  `--continuous-batching`, from bench/.venv-vllm-mlx, built here on first use (`pip install vllm-mlx`,
  plus `mlx[cpu]` on Linux): never a dependency of vllmmlxd.
A mode that the installed vllmmlxd does not have is skipped with a note, and a server that
cannot be installed, started or asked is reported in the table with the reason.

Models: a random-weight ~100M-parameter llama in float32 (written once under the state
directory's bench/ folder, with builtin:tiny's tokenizer and chat template), where the
engine dominates, and builtin:tiny's converted folder, where HTTP overhead dominates.

On Linux every server runs on the same BLAS: the one vllmmlxd's `auto` picks at the start of
the run. vllmmlxd gets it as `--blas NAME --threads N`; the peers get `LD_PRELOAD` and that
library's thread variables (otherwise they would run on MLX's bundled reference BLAS). What
each server process really mapped is read from /proc and shown.

Per server, streamed /v1/completions at temperature 0 (`ignore_eos` where the server has it;
tokens are counted from `usage`, else from the chunks):
- sequential, then 8 and 16 concurrent clients sending requests back to back: aggregate
  completion tok/s and median request latency;
- time to first token of a ~2,000-token prompt, cold, then the same prompt again (prefix hit);
- inter-token gaps of a stream (200 tokens at least) while a second ~2,000-token prompt is
  admitted: the stream's median gap outside the admission, and its worst gap between the
  second request's send and its first token.
vllm-mlx's simple engine is told to queue concurrent requests
(VLLM_MLX_SIMPLE_ENGINE_LOCK_ADMISSION=wait; by default it answers them "busy, retry later"),
and runs with a new empty HOME (it saves its prefix cache to ~/.cache and loads it at start).
Connections refused or reset before any answer (mlx_lm.server listens with a backlog of 5)
are retried, as the OpenAI SDK does, and counted in the notes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx
from common import REPO, cpu_name, ensure_venv, llama_params, write_section

sys.path.insert(0, str(REPO))

from tests.support.servers import free_port, wait_healthy

SECTION = "## Serving: vllmmlxd against mlx_lm.server and vllm-mlx"
VLLM_MLX_VENV = REPO / "bench" / ".venv-vllm-mlx"
SERVERS = {
    "ours-seq": "vllmmlxd, one at a time",
    "ours-batched": "vllmmlxd, batched",
    "mlx-lm": "mlx_lm.server",
    "vllm-mlx": "vllm-mlx, continuous batching",
    "vllm-mlx-simple": "vllm-mlx, simple",
    # With --before REV: the same two modes of vllmmlxd as it was at REV, in the same run.
    "before-seq": "vllmmlxd before, one at a time",
    "before-batched": "vllmmlxd before, batched",
}
MODELS = ("random-100m", "tiny")
RANDOM_NAME = "random-llama-100m-v1"
RANDOM_LLAMA = {  # ~100M parameters, SmolLM2's vocabulary (its tokenizer is copied in)
    "model_type": "llama",
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 10,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "rope_traditional": False,
    "vocab_size": 49152,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "torch_dtype": "float32",
}
PROMPT = "Write a long story about a lighthouse keeper."
LONG_TOKENS = 2000
# Unrelated long prompts, (seed, tokens) each: the warm-up's only needs more than one 512-token prefill chunk.
LONG_PROMPTS = {"warm": (11, 600), "ttft": (12, LONG_TOKENS), "admit": (13, LONG_TOKENS)}
WORDS = [
    "the",
    "harbor",
    "lantern",
    "keeper",
    "storm",
    "tide",
    "rope",
    "ledger",
    "gull",
    "island",
    "winter",
    "fog",
    "bell",
    "ship",
    "captain",
    "supper",
    "letter",
    "cliff",
    "beacon",
    "window",
    "oil",
    "wick",
    "season",
    "salt",
    "current",
    "reef",
    "night",
    "morning",
    "lamp",
    "stair",
    "iron",
    "rain",
    "wind",
    "village",
    "market",
    "boat",
    "net",
    "fish",
    "bread",
    "candle",
    "clock",
    "quiet",
    "voice",
    "shore",
    "stone",
    "path",
]
MAX_CONCURRENCY = 16
START_TIMEOUT = 600  # seconds a server may take to load the model and answer /health


@dataclass(frozen=True)
class Load:
    sequential: int = 8  # requests one after another
    per_client: int = 2  # requests each concurrent client sends back to back
    max_tokens: int = 64
    itl_tokens: int = 200  # chunks of the running stream of the admission test, at least
    itl_max: int = 1000  # its max_tokens: on a fast model it goes on until the long prompt is in
    admit_after: int = 20  # its chunks before the long prompt is sent
    ttft_tokens: int = 4
    phase_timeout: float = 900.0


QUICK = Load(sequential=3, per_client=1, itl_tokens=100)


# -- models, BLAS and prompts: one child process that may import mlx ----------


def prepare(models: list[str], blas: str, threads: int) -> dict:
    """The BLAS vllmmlxd would pick, each model's folder (written once) and its long prompts."""
    from vllmmlxd.runtime.blas import activate

    active = activate(blas, threads)  # before mlx loads, as a worker does
    import mlx.core as mx
    import mlx_lm
    from tokenizers import Tokenizer

    from vllmmlxd.engine.loading.loader import resolve_spec
    from vllmmlxd.paths import resolve_state_dir

    state = resolve_state_dir()
    tiny = Path(resolve_spec("builtin:tiny", state)[0])
    out = {"blas": active.info.as_dict(), "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__, "models": {}}
    for name in models:
        folder = tiny if name == "tiny" else random_llama(state / "bench" / RANDOM_NAME, tiny)
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        out["models"][name] = {
            "folder": str(folder),
            "params": llama_params(json.loads((folder / "config.json").read_text())),
            "weights_mb": sum(f.stat().st_size for f in folder.glob("*.safetensors")) / 1e6,
            "prompts": {kind: long_text(tokenizer, seed, n) for kind, (seed, n) in LONG_PROMPTS.items()},
        }
    return out


def random_llama(folder: Path, tokenizer_from: Path) -> Path:
    """A float32 llama with random weights, as an MLX folder; written once, then reused."""
    if (folder / "model.safetensors").is_file():
        return folder
    import mlx.core as mx
    from mlx_lm.models.llama import Model, ModelArgs

    print(f"writing a random {llama_params(RANDOM_LLAMA) / 1e6:.0f}M-parameter llama to {folder}", file=sys.stderr)
    mx.random.seed(0)
    model = Model(ModelArgs.from_dict(RANDOM_LLAMA))
    mx.eval(model.parameters())
    work = folder.with_name(folder.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    model.save_weights(str(work / "model.safetensors"))
    (work / "config.json").write_text(json.dumps(RANDOM_LLAMA, indent=2) + "\n")
    for f in tokenizer_from.iterdir():  # tokenizer.json, tokenizer_config.json (with the chat template), ...
        if f.is_file() and not f.name.startswith(".") and f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, work / f.name)
    work.rename(folder)
    return folder


def long_text(tokenizer, seed: int, tokens: int) -> str:
    """Plain sentences that tokenize to about ``tokens`` tokens."""
    rng = random.Random(seed)
    sentences: list[str] = []
    while True:
        sentences += [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 16))).capitalize() + "." for _ in range(200)
        ]
        ids = tokenizer.encode(" ".join(sentences), add_special_tokens=False).ids
        if len(ids) > tokens:
            return tokenizer.decode(ids[:tokens])


def run_prepare(models: list[str], blas: str, threads: int) -> dict:
    proc = subprocess.run(
        [sys.executable, __file__, "--prepare", ",".join(models), blas, str(threads)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    if proc.returncode != 0:
        raise SystemExit(f"preparing the models failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# -- the servers ---------------------------------------------------------------


class Unavailable(Exception):
    """This server or mode cannot be run here; the message says why."""


@dataclass
class Contender:
    key: str
    argv: list[str]  # with {folder} and {port} to fill in
    env: dict[str, str] = field(default_factory=dict)
    ignore_eos: bool = False
    note: str = ""
    cwd: Path = REPO  # a before-* server runs from its own tree: `python -m` imports from the cwd first


def ours_modes(tree: Path = REPO) -> dict[str, tuple[list[str], str]]:
    """vllmmlxd's modes that its CLI has: key -> (flags, note). Read from `vllmmlxd serve --help`."""
    text = subprocess.run(
        [sys.executable, "-m", "vllmmlxd.cli", "serve", "--help"], capture_output=True, text=True, cwd=tree
    ).stdout
    if "--no-continuous-batching" in text:
        batched = ["--max-num-seqs", str(MAX_CONCURRENCY)] if "--max-num-seqs" in text else []
        return {"ours-seq": (["--no-continuous-batching"], ""), "ours-batched": (batched, "")}
    return {"ours-seq": ([], "this vllmmlxd has no --no-continuous-batching: it serves one request at a time")}


def vllm_mlx_venv() -> tuple[Path, dict[str, str]]:
    """The bench-only venv's bin folder, and the versions it holds."""
    packages = ["vllm-mlx"] + (["mlx[cpu]"] if sys.platform.startswith("linux") else [])
    try:
        python = ensure_venv(VLLM_MLX_VENV, packages)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        raise Unavailable(f"could not install {' '.join(packages)} into {VLLM_MLX_VENV.name}: {exc}") from exc
    return python.parent, package_versions(python, ("vllm-mlx", "mlx-lm", "mlx"))


def package_versions(python: Path | str, names: tuple[str, ...]) -> dict[str, str]:
    code = (
        "import importlib.metadata as m, json, sys\n"
        "def v(n):\n    try: return m.version(n)\n    except m.PackageNotFoundError: return None\n"
        "print(json.dumps({n: v(n) for n in sys.argv[1:]}))"
    )
    out = subprocess.run([str(python), "-c", code, *names], capture_output=True, text=True).stdout
    return json.loads(out or "{}")


def before_tree(rev: str) -> Path:
    """The repository as it was at ``rev``, written to a temporary folder (its vllmmlxd runs from there)."""
    tree = Path(tempfile.mkdtemp(prefix="peers-before-"))
    archive = subprocess.run(["git", "archive", rev], cwd=REPO, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def contender(key: str, blas: dict, modes: dict, peer_bin: Path | None) -> Contender:
    """How to start ``key``; raises Unavailable with the reason when it cannot be run."""
    if key.startswith("before-"):
        if "before" not in modes:
            raise Unavailable("no --before REV given")
        tree, before_modes = modes["before"]
        c = contender(key.replace("before-", "ours-"), blas, before_modes, peer_bin)
        return replace(c, key=key, cwd=tree)
    if key.startswith("ours-"):
        if key not in modes:
            raise Unavailable(
                "not available in this vllmmlxd: `vllmmlxd serve --help` has no "
                "--continuous-batching/--no-continuous-batching (it serves one request at a time)"
            )
        flags, note = modes[key]
        pinned = ["--blas", blas["name"], "--threads", str(blas["threads"])] if sys.platform.startswith("linux") else []
        argv = [sys.executable, "-m", "vllmmlxd.cli", "serve", "{folder}", "--port", "{port}", *flags, *pinned]
        return Contender(key, argv, ignore_eos=True, note=note)
    env = peer_blas_env(blas)
    if key == "mlx-lm":
        return Contender(
            key, [sys.executable, "-m", "mlx_lm", "server", "--model", "{folder}", "--port", "{port}"], env
        )
    if peer_bin is None:
        raise Unavailable("vllm-mlx was not installed")
    # Its prefix cache is saved under ~/.cache and loaded at start: a fresh HOME keeps "cold" cold.
    env.update({"HF_HUB_OFFLINE": "1", "HOME": "{home}"})
    note = "HOME is a new empty folder: vllm-mlx saves its prefix cache under ~/.cache and loads it at start"
    if key == "vllm-mlx":
        return Contender(
            key,
            [str(peer_bin / "vllm-mlx"), "serve", "{folder}", "--port", "{port}", "--continuous-batching"],
            env,
            note=note,
        )
    # Its simple engine answers a request that arrives while another runs with an error ("busy; retry
    # later") unless told to queue it, as vllmmlxd's one-at-a-time mode does.
    env["VLLM_MLX_SIMPLE_ENGINE_LOCK_ADMISSION"] = "wait"
    return Contender(key, [str(peer_bin / "vllm-mlx"), "serve", "{folder}", "--port", "{port}"], env, note=note)


def peer_blas_env(blas: dict) -> dict[str, str]:
    """LD_PRELOAD of the library vllmmlxd picked, with its thread variables (Linux only)."""
    if not sys.platform.startswith("linux") or not blas.get("path") or blas["name"] == "bundled":
        return {}
    from vllmmlxd.runtime.blas_find import thread_env

    return {"LD_PRELOAD": blas["path"], **thread_env(blas["name"], blas["threads"], Path(blas["path"]))}


LIVE: list[subprocess.Popen] = []  # every server still running, stopped on the way out whatever happens


@dataclass
class Running:
    proc: subprocess.Popen
    port: int
    log: Path
    home: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def launch(c: Contender, folder: str) -> Running:
    """Start the server (not yet waiting for it)."""
    port = free_port()
    home = Path(tempfile.mkdtemp(prefix=f"peers-{c.key}-home-"))
    fill = {"folder": folder, "port": str(port), "home": str(home)}
    argv = [a.format(**fill) for a in c.argv]
    env = {**os.environ, **{k: v.format(**fill) for k, v in c.env.items()}}
    log = Path(tempfile.mkstemp(prefix=f"peers-{c.key}-", suffix=".log")[1])
    with log.open("wb") as out:  # its own process group: stopped with all its children
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=c.cwd, start_new_session=True)
    LIVE.append(proc)
    return Running(proc, port, log, home)


def stop(r: Running) -> None:
    stop_proc(r.proc)
    shutil.rmtree(r.home, ignore_errors=True)


def stop_proc(proc: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM to the server's process group, then SIGKILL to whatever of the group is left."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break  # nothing of the group is left
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    if proc in LIVE:
        LIVE.remove(proc)


BLAS_FILES = {"libmkl_rt": "mkl", "libblis": "blis", "libopenblas": "openblas"}


def blas_mapped(pid: int) -> str:
    """The optimised BLAS libraries a server's processes have mapped (from /proc), else 'bundled'."""
    pids = [pid]
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[2]) == pid and int(stat.parent.name) != pid:  # same process group
                pids.append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found = set()
    for p in pids:
        try:
            maps = Path(f"/proc/{p}/maps").read_text()
        except OSError:
            continue
        found |= {name for prefix, name in BLAS_FILES.items() if f"/{prefix}" in maps}
    return ", ".join(sorted(found)) or "bundled"


# -- load ------------------------------------------------------------------------


@dataclass
class Reply:
    sent: float
    chunks: list[float]  # arrival of each chunk with text
    done: float = 0.0
    tokens: int = 0  # from usage, else the chunks with text

    @property
    def latency(self) -> float:
        return self.done - self.sent

    @property
    def ttft(self) -> float:
        return (self.chunks[0] if self.chunks else self.done) - self.sent


class Client:
    """Streamed completions; a connection refused or reset before any answer is retried, as SDKs do."""

    RETRIED = (httpx.ConnectError, httpx.ReadError, httpx.WriteError, httpx.RemoteProtocolError)

    def __init__(self, url: str, model: str, ignore_eos: bool, extra: dict | None = None):
        self.url, self.model, self.ignore_eos = url + "/v1/completions", model, ignore_eos
        self.extra = extra or {}  # more request fields
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(600, connect=10), limits=httpx.Limits(max_connections=2 * MAX_CONCURRENCY)
        )
        self.retries = 0

    async def complete(self, prompt: str, max_tokens: int, on_chunk=None) -> Reply:
        """One request; ``on_chunk(n)`` after each chunk with text, and a true answer ends the stream there."""
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            **self.extra,
        }
        if self.ignore_eos:
            body["ignore_eos"] = True
        reply, usage = Reply(time.perf_counter(), []), None
        for attempt in range(4):
            try:
                r = await self.http.send(self.http.build_request("POST", self.url, json=body), stream=True)
                break
            except self.RETRIED:
                if attempt == 3:
                    raise
                self.retries += 1
                await asyncio.sleep(0.1 * (attempt + 1))
        try:
            if r.status_code != 200:
                raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread()).decode(errors='replace')[:300]}")
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue  # blank lines, and mlx_lm's ": keepalive" comments
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                event = json.loads(data)
                if "error" in event:
                    raise RuntimeError(f"error event: {json.dumps(event['error'])[:300]}")
                usage = event.get("usage") or usage
                texts = [
                    c["text"] if "text" in c else (c.get("delta") or {}).get("content")
                    for c in event.get("choices") or []
                ]
                if any(texts):
                    reply.chunks.append(time.perf_counter())
                    if on_chunk and on_chunk(len(reply.chunks)):
                        break  # closing the connection cancels the request
        finally:
            await r.aclose()
        reply.done = time.perf_counter()
        reply.tokens = usage["completion_tokens"] if usage and "completion_tokens" in usage else len(reply.chunks)
        return reply

    async def close(self) -> None:
        await self.http.aclose()


async def throughput(client: Client, clients: int, requests_each: int, max_tokens: int) -> dict:
    """``clients`` concurrent clients, each sending ``requests_each`` requests back to back."""

    async def one_client() -> list[Reply]:
        return [await client.complete(PROMPT, max_tokens) for _ in range(requests_each)]

    started = time.perf_counter()
    async with asyncio.TaskGroup() as group:  # one failure cancels the other clients: no strays into the next phase
        tasks = [group.create_task(one_client()) for _ in range(clients)]
    replies = [r for t in tasks for r in t.result()]
    elapsed = time.perf_counter() - started
    tokens = sum(r.tokens for r in replies)
    return {
        "tps": tokens / elapsed,
        "latency_s": statistics.median(r.latency for r in replies),
        "tokens_per_request": tokens / len(replies),
        "requests": len(replies),
    }


async def ttft(client: Client, prompt: str, max_tokens: int) -> dict:
    cold = await client.complete(prompt, max_tokens)
    hit = await client.complete(prompt, max_tokens)
    return {"cold_s": cold.ttft, "hit_s": hit.ttft}


async def admission_gaps(client: Client, long_prompt: str, load: Load, patience: float) -> dict:
    """Gaps of a running stream while a long prompt is admitted beside it.

    The stream asks for up to ``itl_max`` tokens and is ended once it has ``itl_tokens`` chunks and
    the long prompt has its first token plus ``admit_after`` more chunks of the stream, or, when the
    long prompt is still waiting, ``patience`` seconds after it was sent (a server that serves one
    request at a time only starts it then).
    """
    reached = asyncio.Event()
    at = {"chunks": 0, "sent": None, "admitted": None}

    def on_stream_chunk(n: int) -> bool:
        at["chunks"] = n
        if n == load.admit_after:
            reached.set()
        if n < load.itl_tokens or at["sent"] is None:
            return False
        if at["admitted"] is not None:
            return n >= at["admitted"] + load.admit_after
        return time.perf_counter() - at["sent"] > patience

    def on_long_chunk(n: int) -> bool:
        if n == 1:
            at["admitted"] = at["chunks"]
        return False

    stream = asyncio.create_task(client.complete(PROMPT, load.itl_max, on_chunk=on_stream_chunk))
    waiter = asyncio.create_task(reached.wait())
    try:
        await asyncio.wait({stream, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if not reached.is_set():
            first = await stream
            return {"error": f"the stream ended after {len(first.chunks)} chunks, before {load.admit_after}"}
        at["sent"] = sent = time.perf_counter()
        second = await client.complete(long_prompt, 2, on_chunk=on_long_chunk)
        first = await stream
    finally:  # whatever failed, nothing of this test goes on reading
        waiter.cancel()
        stream.cancel()
    admitted = second.chunks[0] if second.chunks else second.done
    end = min(admitted, first.chunks[-1])
    gaps = [(a, b - a) for a, b in zip(first.chunks, first.chunks[1:])]
    during = [g for a, g in gaps if a + g > sent and a < end]
    steady = [g for a, g in gaps if a + g <= sent or a >= end]  # the stream at its own pace, alone or beside a decode
    if not during or not steady:
        return {"error": f"too few chunks around the admission ({len(steady)} outside, {len(during)} inside)"}
    return {
        "median_s": statistics.median(steady),
        "mean_s": statistics.fmean(steady),
        "worst_s": max(during),
        "during_median_s": statistics.median(during),
        "admit_s": admitted - sent,
        "after_stream": admitted > first.chunks[-1],
        "stream_chunks": len(first.chunks),
    }


async def measure(url: str, model: str, ignore_eos: bool, prompts: dict, load: Load, alive) -> tuple[dict, int]:
    """Every measurement against one running server, and the connections retried.

    A phase that fails is recorded and the rest go on.
    """
    client = Client(url, model, ignore_eos)
    nonce = uuid.uuid4().hex[:8]  # a prefix no cache of any run has seen: cold stays cold
    long = {kind: f"Session {nonce}, {kind}. {text}" for kind, text in prompts.items()}
    results: dict = {}
    phases = {
        "warmup": lambda: warm_up(client, long["warm"]),
        "seq": lambda: throughput(client, 1, load.sequential, load.max_tokens),
        "c8": lambda: throughput(client, 8, load.per_client, load.max_tokens),
        "c16": lambda: throughput(client, 16, load.per_client, load.max_tokens),
        "ttft": lambda: ttft(client, long["ttft"], load.ttft_tokens),
        "itl": lambda: admission_gaps(client, long["admit"], load, patience(results.get("ttft", {}))),
    }
    try:
        for name, phase in phases.items():
            if not alive():
                results[name] = {"error": "the server exited"}
                continue
            started = time.perf_counter()
            try:
                results[name] = await asyncio.wait_for(phase(), load.phase_timeout)
            except Exception as exc:
                reason = "timed out" if isinstance(exc, asyncio.TimeoutError) else f"{type(exc).__name__}: {exc}"
                results[name] = {"error": reason}
            print(f"    {name}: {short(results[name])} ({time.perf_counter() - started:.0f} s)", file=sys.stderr)
    finally:
        await client.close()
    if client.retries:
        print(f"    {client.retries} connection(s) refused or reset before an answer, retried", file=sys.stderr)
    return results, client.retries


def patience(ttft_result: dict) -> float:
    """How long the admission test waits for the long prompt's first token beside the stream."""
    return 2.0 + 2 * ttft_result.get("cold_s", 5.0)


async def warm_up(client: Client, long_prompt: str) -> dict:
    await client.complete(PROMPT, 8)
    await throughput(client, 4, 1, 8)
    await client.complete(long_prompt, 1)
    return {}


def short(result: dict) -> str:
    if "error" in result:
        return "error: " + result["error"][:200]
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in result.items()) or "ok"


def run_server(key: str, model: dict, blas: dict, modes: dict, peer_bin: Path | None, load: Load) -> dict:
    """Start one server on one model, measure it, stop it: a row of the table."""
    row = {"key": key}
    try:
        c = contender(key, blas, modes, peer_bin)
    except Unavailable as exc:
        return {**row, "skipped": str(exc)}
    row.update(
        command=display(c.argv),
        env={k: v for k, v in c.env.items() if k != "HOME"},
        note=c.note,
        ignore_eos=c.ignore_eos,
    )
    print(f"  {key}: starting", file=sys.stderr)
    started = time.perf_counter()
    running = launch(c, model["folder"])
    try:
        try:
            wait_healthy(running.url, running.proc, running.log, timeout=START_TIMEOUT)
        except (RuntimeError, TimeoutError):
            code = running.proc.poll()
            row["failed"] = (
                f"exited with {code} while starting" if code is not None else f"not healthy after {START_TIMEOUT} s"
            ) + f": {last_line(running.log)}"
            row["results"] = {}
            return row
        row["start_s"] = time.perf_counter() - started
        row["blas_seen"] = blas_mapped(running.proc.pid) if sys.platform.startswith("linux") else "accelerate"
        if key.startswith("ours-"):
            row["blas_reported"] = reported_blas(running.url)
        alive = lambda: running.proc.poll() is None  # noqa: E731
        row["results"], row["retries"] = asyncio.run(
            measure(running.url, model["folder"], c.ignore_eos, model["prompts"], load, alive)
        )
        if running.proc.poll() is not None:
            row["failed"] = f"exited with {running.proc.returncode}: {last_line(running.log)}"
    finally:
        stop(running)
        if row.get("failed") or any("error" in r for r in row.get("results", {}).values()):
            print(f"  {key}: see its log, {running.log}", file=sys.stderr)
        else:
            running.log.unlink(missing_ok=True)
    return row


def last_line(log: Path) -> str:
    """The last line a server wrote: the exception, when it died of one."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][-500:] if lines else "(it wrote nothing)"


def reported_blas(url: str) -> str | None:
    try:
        runtime = httpx.get(url + "/v1/status", timeout=10).json().get("runtime") or {}
        threads = runtime.get("threads")
        return f"{runtime['blas']} ({threads} thread{'' if threads == 1 else 's'})" if "blas" in runtime else None
    except (httpx.HTTPError, ValueError):
        return None


def display(argv: list[str]) -> str:
    """The command line as a reader would type it."""
    words = " ".join(a if a and all(ch.isalnum() or ch in "-_./:={}[]," for ch in a) else repr(a) for a in argv)
    words = words.replace(f"{sys.executable} -m vllmmlxd.cli ", "vllmmlxd ").replace(sys.executable, "python")
    return words.replace(str(REPO) + "/", "").replace("{folder}", "FOLDER").replace("{port}", "PORT")


# -- report ----------------------------------------------------------------------


def cell(result: dict | None, fmt) -> str:
    if not result:
        return "-"
    if "error" in result:
        return "error"
    return fmt(result)


def ms(seconds: float) -> str:
    return f"{seconds * 1e3:.0f}" if seconds >= 0.01 else f"{seconds * 1e3:.2g}"


def times(ratio: float) -> str:
    return f"{ratio:.0f}x" if ratio >= 100 else f"{ratio:.3g}x"


def tps(v: float) -> str:
    return f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def render(prep: dict, rows: dict[str, list[dict]], load: Load, command: str, versions: dict) -> str:
    blas = prep["blas"]
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    lines = [
        SECTION,
        "",
        f"- Date: {time.strftime('%Y-%m-%d')}; command: `{command}`",
        f"- Machine: {platform.system()} {platform.machine()}, {cpu_name()}, {cores} cores, MLX {prep['mlx']}",
        f"- Versions: vllmmlxd {versions['vllmmlxd']}, mlx-lm {prep['mlx_lm']} (vllmmlxd's venv)"
        + (
            f", vllm-mlx {versions['vllm-mlx'].get('vllm-mlx')} with mlx-lm {versions['vllm-mlx'].get('mlx-lm')} and "
            f"MLX {versions['vllm-mlx'].get('mlx')} (bench/.venv-vllm-mlx)"
            if versions.get("vllm-mlx")
            else ""
        ),
    ]
    if sys.platform.startswith("linux"):
        lines.append(
            f"- BLAS: {blas['name']} ({blas['path']}, {blas['threads']} threads), what vllmmlxd's `--blas "
            f"{blas['requested']}` picks here; vllmmlxd runs with `--blas {blas['name']} --threads {blas['threads']}`, "
            "mlx_lm.server and vllm-mlx with `LD_PRELOAD` of that library and its thread variables "
            f"({', '.join(f'{k}={v}' for k, v in peer_blas_env(blas).items() if k != 'LD_PRELOAD') or 'none'}), "
            "so that the servers, not the BLAS, are compared; the column BLAS is what each server process had mapped"
            + (f". Warning: {blas['warning']}" if blas.get("warning") else "")
        )
    lines.append(
        f"- Load: streamed `/v1/completions` of a fixed short prompt, temperature 0, max_tokens {load.max_tokens} "
        f"(`ignore_eos` for vllmmlxd; the peers have no such option, so their tokens are what they returned); "
        f"sequential: {load.sequential} requests; 8- and 16-way: each client sends {load.per_client} back to back; "
        f"tok/s = completion tokens of all requests / wall time, after a warm-up (one short request, 4 concurrent "
        f"ones, a {LONG_PROMPTS['warm'][1]}-token prompt). TTFT: a ~{LONG_TOKENS}-token prompt, "
        f"max_tokens {load.ttft_tokens}, cold then again (prefix hit). ITL: a stream of at least {load.itl_tokens} "
        f"chunks; after its {load.admit_after}th a second ~{LONG_TOKENS}-token prompt is sent; the stream's median gap "
        "outside the admission / its worst gap between that send and the second request's first token (\"after the "
        'stream": that token came only once the stream had ended, as on a server that serves one request at a time)'
    )
    for name, model_rows in rows.items():
        model = prep["models"][name]
        lines += [
            "",
            f"### `{'builtin:tiny' if name == 'tiny' else name}`: {model['params'] / 1e6:.0f}M parameters, "
            f"{model['weights_mb']:.0f} MB float32 (`{model['folder']}`)",
            "",
            "| server | BLAS | seq tok/s | 8-way tok/s | 16-way tok/s | seq latency p50 | 16-way latency p50 "
            "| TTFT cold | TTFT prefix hit | ITL median / worst during admission |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        notes = []
        for row in model_rows:
            label = SERVERS[row["key"]]
            why = row.get("skipped") or row.get("failed")
            res = row.get("results", {})
            if why and not any(res.values()):
                lines.append(
                    f"| {label} | {'not run' if 'skipped' in row else 'failed'}: {first_line(why)} |" + " - |" * 8
                )
            else:
                lines.append(
                    " | ".join(
                        [
                            f"| {label}",
                            row.get("blas_seen", "-"),
                            cell(res.get("seq"), lambda r: tps(r["tps"])),
                            cell(res.get("c8"), lambda r: tps(r["tps"])),
                            cell(res.get("c16"), lambda r: tps(r["tps"])),
                            cell(res.get("seq"), lambda r: f"{r['latency_s']:.2f} s"),
                            cell(res.get("c16"), lambda r: f"{r['latency_s']:.2f} s"),
                            cell(res.get("ttft"), lambda r: f"{r['cold_s'] * 1e3:.0f} ms"),
                            cell(res.get("ttft"), lambda r: f"{r['hit_s'] * 1e3:.0f} ms"),
                            cell(
                                res.get("itl"),
                                lambda r: (
                                    f"{ms(r['median_s'])} / {ms(r['worst_s'])} ms "
                                    f"({times(r['worst_s'] / r['median_s'])}){' (after the stream)' if r['after_stream'] else ''}"
                                ),
                            ),
                        ]
                    )
                    + " |"
                )
            notes.append(server_note(label, row, load))
        lines += ["", *notes, "", *targets(name, model_rows)]
    return "\n".join(lines) + "\n"


def first_line(text: str, limit: int = 160) -> str:
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    return (line[:limit] + "...") if len(line) > limit else line.replace("|", "\\|")


def server_note(label: str, row: dict, load: Load) -> str:
    if "skipped" in row and "command" not in row:
        return f"- {label}: not run: {row['skipped']}"
    env = " ".join(f"{k}={v}" for k, v in row.get("env", {}).items() if k != "HF_HUB_OFFLINE")
    parts = [f"- {label}: `{(env + ' ') if env else ''}{row['command']}`"]
    if row.get("note"):
        parts.append(row["note"])
    if row.get("blas_reported"):
        parts.append(f"its /v1/status reports {row['blas_reported']}")
    res = row.get("results", {})
    counts = [f"{r['tokens_per_request']:.1f}" for k in ("seq", "c8", "c16") if "tps" in (r := res.get(k, {}))]
    if counts and any(float(c) < load.max_tokens for c in counts):
        parts.append(f"tokens per request (seq, 8-way, 16-way): {', '.join(counts)} of {load.max_tokens}")
    itl = res.get("itl", {})
    if "admit_s" in itl:
        parts.append(
            f"beside the stream, the long prompt got its first token {itl['admit_s']:.2f} s after it was sent"
            + (
                " (after the stream had ended)"
                if itl["after_stream"]
                else f", the stream's median gap meanwhile {ms(itl['during_median_s'])} ms"
            )
        )
        if itl["mean_s"] > 2 * itl["median_s"]:
            parts.append(
                f"the stream's chunks came in bursts: mean gap {ms(itl['mean_s'])} ms, median {ms(itl['median_s'])} ms"
            )
    if row.get("retries"):
        parts.append(f"{row['retries']} connection(s) refused or reset before an answer, retried")
    errors = [f"{k}: {r['error']}" for k, r in res.items() if "error" in r]
    if row.get("failed"):
        errors.insert(0, row["failed"])
    if errors:
        parts.append("errors: " + "; ".join(first_line(e, 300) for e in errors))
    return "; ".join(parts)


def targets(name: str, model_rows: list[dict]) -> list[str]:
    by_key = {r["key"]: r.get("results", {}) for r in model_rows}

    def value(key: str, phase: str, field_: str) -> float | None:
        return by_key.get(key, {}).get(phase, {}).get(field_)

    ours = next((k for k in ("ours-batched", "ours-seq") if by_key.get(k)), None)
    vllm = next((k for k in ("vllm-mlx", "vllm-mlx-simple") if by_key.get(k)), None)
    lines = [f"Targets on `{name}` (ratios within this run):", ""]

    def ratio_line(what: str, num: float | None, den: float | None, goal: float, at_most: bool = False) -> None:
        if num is None or den is None or not den:
            lines.append(f"- {what}: n/a (not measured)")
            return
        r = num / den
        met = r <= goal if at_most else r >= goal
        lines.append(
            f"- {what}: {times(r)} (goal {'<=' if at_most else '>='} {goal:g}x): {'met' if met else 'NOT met'}"
        )

    seq_base = "ours-seq" if value("ours-seq", "seq", "tps") else "ours-batched"
    ratio_line(
        f"batched 16-way / our sequential ({SERVERS[seq_base]}){'' if name == MODELS[0] else ' (the goal is for the larger model)'}",
        value("ours-batched", "c16", "tps"),
        value(seq_base, "seq", "tps"),
        4,
    )
    if ours:
        for peer, goal in (("mlx-lm", 1.0), (vllm, 1.2)):
            if peer is None:
                lines.append("- vllmmlxd / vllm-mlx: n/a (vllm-mlx not measured)")
                continue
            for phase, what in (("seq", "sequential"), ("c16", "16-way")):
                ratio_line(
                    f"{SERVERS[ours]} / {SERVERS[peer]}, {what}",
                    value(ours, phase, "tps"),
                    value(peer, phase, "tps"),
                    goal,
                )
        ratio_line(
            f"prefix-hit TTFT / cold TTFT, {SERVERS[ours]}",
            value(ours, "ttft", "hit_s"),
            value(ours, "ttft", "cold_s"),
            0.1,
            at_most=True,
        )
        ratio_line(
            f"worst gap during admission / median gap, {SERVERS[ours]}",
            value(ours, "itl", "worst_s"),
            value(ours, "itl", "median_s"),
            3,
            at_most=True,
        )
        worst, mean, median = (value(ours, "itl", f) for f in ("worst_s", "mean_s", "median_s"))
        if worst and mean and median and mean > 2 * median:
            lines[-1] += (
                f" (its chunks came in bursts, which make the median small: against the mean gap, "
                f"{ms(mean)} ms, the worst is {times(worst / mean)})"
            )
    else:
        lines.append("- vllmmlxd was not measured: no ratio")
    return lines


# -- main ------------------------------------------------------------------------


def our_version() -> str:
    from vllmmlxd import __version__

    git = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True, cwd=REPO).stdout
    return f"{__version__} ({git.strip()})" if git.strip() else __version__


def _stop_everything(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through every finally, which stops the servers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default=",".join(SERVERS), help=f"comma-separated, among {', '.join(SERVERS)}")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, among {', '.join(MODELS)}")
    ap.add_argument(
        "--quick",
        action="store_true",
        help=f"fewer requests (sequential {QUICK.sequential}, {QUICK.per_client} per concurrent client, "
        f"a {QUICK.itl_tokens}-token ITL stream): a smoke run",
    )
    ap.add_argument(
        "--blas", default="auto", help="Linux: the BLAS for every server (default: what vllmmlxd's auto picks)"
    )
    ap.add_argument("--phase-timeout", type=float, default=Load.phase_timeout, help="seconds one measurement may take")
    ap.add_argument("--write", type=Path, help=f"replace the section '{SECTION}' of this markdown file")
    ap.add_argument("--before", metavar="REV", help="also run vllmmlxd as it was at git REV (before-seq, before-batched)")
    ap.add_argument("--prepare", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.prepare:
        models, blas, threads = args.prepare
        print(json.dumps(prepare(models.split(","), blas, int(threads))))
        return
    servers, models = args.servers.split(","), args.models.split(",")
    for given, known in ((servers, SERVERS), (models, MODELS)):
        if unknown := [x for x in given if x not in known]:
            ap.error(f"unknown: {', '.join(unknown)} (known: {', '.join(known)})")
    load = replace(QUICK if args.quick else Load(), phase_timeout=args.phase_timeout)
    # Our own handlers, also for Ctrl-C: asyncio's turns the first one into a cancellation, which a
    # phase finishing at that moment can swallow.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, _stop_everything)
    try:
        run(args, servers, models, load)
    finally:
        for proc in list(LIVE):
            stop_proc(proc)


def run(args, servers: list[str], models: list[str], load: Load) -> None:
    from vllmmlxd.runtime.cpus import available_cpus

    threads = len(available_cpus())
    print(f"preparing {', '.join(models)} and choosing the BLAS ({args.blas}, {threads} threads)", file=sys.stderr)
    prep = run_prepare(models, args.blas, threads)
    print(f"BLAS: {prep['blas']['name']} {prep['blas']['path'] or ''}", file=sys.stderr)
    modes: dict = ours_modes() if any(s.startswith("ours-") for s in servers) else {}
    if args.before:
        tree = before_tree(args.before)
        modes["before"] = (tree, ours_modes(tree))
        versions_before = f"git {args.before}"
        print(f"before: {versions_before} in {tree}", file=sys.stderr)
    versions: dict = {"vllmmlxd": our_version()}
    peer_bin, peer_error = None, None
    if any(s.startswith("vllm-mlx") for s in servers):
        try:
            peer_bin, versions["vllm-mlx"] = vllm_mlx_venv()
        except Unavailable as exc:
            peer_error = str(exc)
            print(f"vllm-mlx: {peer_error}", file=sys.stderr)
    rows: dict[str, list[dict]] = {}
    for name in models:
        print(f"{name}: {prep['models'][name]['folder']}", file=sys.stderr)
        rows[name] = []
        for key in servers:
            if key.startswith("vllm-mlx") and peer_error:
                rows[name].append({"key": key, "skipped": peer_error})
                continue
            rows[name].append(run_server(key, prep["models"][name], prep["blas"], modes, peer_bin, load))
    command = (
        "python bench/peers.py"
        + "".join(
            f" {flag} {value}"
            for flag, value, default in (
                ("--servers", args.servers, ",".join(SERVERS)),
                ("--models", args.models, ",".join(MODELS)),
                ("--blas", args.blas, "auto"),
                ("--before", args.before, None),
            )
            if value != default
        )
        + (" --quick" if args.quick else "")
    )
    text = render(prep, rows, load, command, versions)
    print(text)
    if args.write:
        write_section(args.write, SECTION, text)


if __name__ == "__main__":
    main()
