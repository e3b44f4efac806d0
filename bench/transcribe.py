"""Speech to text's real-time factor (seconds of audio per second of wall time) on this machine.

    python bench/transcribe.py [--runs 2] [--write docs/benchmarks.md]

builtin:tiny-whisper (random weights in Whisper's shape: 2+2 layers, width 64, Whisper's
multilingual vocabulary; decoding stops at 64 tokens a 30 s window) transcribes a 30 s and a
120 s file of generated noise, greedy (temperature 0, language given): in-process (the
transcriber alone, on this thread) and through `vllmmlxd serve` with the official SDK (upload,
PyAV decoding, the speech thread, the response). Best of --runs after a warm-up. The weights are
random: what it writes is noise, and these numbers are speed only, of this shape, not of a real
Whisper checkpoint's accuracy or of its larger size.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

from common import REPO, cpu_name, publish

sys.path.insert(0, str(REPO))

from tests.support.audio import noise, wav
from tests.support.servers import start_serve

MODEL = "builtin:tiny-whisper"
LENGTHS = (30.0, 120.0)


def best(runs: int, work) -> float:
    """The shortest wall time of ``runs`` calls of ``work``, after one warm-up call."""
    work()
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return min(times)


def in_process(runs: int) -> dict[float, float]:
    from vllmmlxd.engine.loading.builtin import ensure_builtin
    from vllmmlxd.engine.speech.decode import AudioLimits, decode_audio
    from vllmmlxd.engine.speech.transcriber import SpeechRequest, Transcriber
    from vllmmlxd.paths import resolve_state_dir

    folder = ensure_builtin(MODEL.split(":", 1)[1], resolve_state_dir(None))
    transcriber = Transcriber(folder, name=MODEL, source=MODEL, threaded=False)
    limits = AudioLimits(max_bytes=100 * 1024 * 1024, max_seconds=3600)
    out = {}
    for seconds in LENGTHS:
        samples = decode_audio(wav(noise(seconds, seed=1)), limits)
        request = SpeechRequest(samples, language="en", temperature=0.0)
        out[seconds] = best(runs, lambda r=request: transcriber.run(r))
    return out


def served(runs: int) -> tuple[dict[float, float], str]:
    import openai

    server = start_serve(MODEL, "--served-model-name", "whisper", threads=None)
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0, timeout=600)
        out = {}
        for seconds in LENGTHS:
            data = wav(noise(seconds, seed=1))
            out[seconds] = best(
                runs,
                lambda d=data: client.audio.transcriptions.create(
                    model="whisper", file=("noise.wav", d), language="en", temperature=0
                ),
            )
        import httpx

        return out, str(httpx.get(server.url + "/v1/status", timeout=10).json()["runtime"]["threads"])
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--write", type=Path, help="replace this bench's section of docs/benchmarks.md")
    args = parser.parse_args()
    local = in_process(args.runs)
    remote, threads = served(args.runs)
    lines = [
        "## Speech to text: real-time factor (bench/transcribe.py)",
        "",
        f"{cpu_name()}, {platform.system()} {platform.machine()}; {MODEL}, random weights in Whisper's shape "
        "(2+2 layers, width 64, Whisper's multilingual vocabulary, at most 64 tokens a 30 s window): "
        "**speed only**, its text is noise. Generated noise as 16 kHz WAV, greedy (temperature 0), language "
        f"given; best of {args.runs} after a warm-up. Real-time factor = seconds of audio / seconds of wall time.",
        "",
        "| audio | in-process (s) | in-process RTF | `vllmmlxd serve` + SDK (s) | served RTF |",
        "|---|---|---|---|---|",
    ]
    for seconds in LENGTHS:
        lines.append(
            f"| {seconds:.0f} s | {local[seconds]:.2f} | {seconds / local[seconds]:.1f}x | "
            f"{remote[seconds]:.2f} | {seconds / remote[seconds]:.1f}x |"
        )
    lines += [
        "",
        f"Served: the worker's default threads ({threads} BLAS thread(s) here), one request at a time (the speech thread serves one upload at "
        "a time). A real checkpoint is larger (whisper-tiny: width 384, 4+4 layers; up to 224 tokens a window) "
        "and slower per window than this shape.",
    ]
    publish(lines, args.write)


if __name__ == "__main__":
    main()
