"""A scheduler on a real model, stepped from the caller's thread, its answers read back as token
ids: how the fidelity tests and the doctor's self-test drive one path of the engine."""

from __future__ import annotations

import asyncio
import itertools
import re
from collections.abc import Iterable
from typing import Any

from ..options import EngineOptions
from ..step.scheduler import Scheduler
from ..step.sequence import Sequence
from ..text.detokenize import IncrementalDetokenizer
from ..types import EngineStats, GenerationRequest, Logprobs, SamplingParams

CHUNKS = (1, 5, 48, 16, 2, 48, 31, 7)  # the prefill chunk of each step in turn
MAX_STEPS = 10_000


class ScriptedChunks:
    """Prefill chunks by construction, not by the machine's pace: odd ones among them (a one-token
    chunk takes mlx-lm's decoding path), the same on every run."""

    def __init__(self, chunks: Iterable[int]):
        self.sizes = itertools.cycle(chunks)

    def __call__(self, max_chunk: int, *, decoding: bool, prompts: int) -> int:
        return next(self.sizes)


class Driver:
    """A scheduler on a real model, stepped from the caller's thread; answers read back as token ids."""

    def __init__(
        self, model: Any, options: EngineOptions, cache: Any = None, draft: Any = None, chunks: Iterable[int] = CHUNKS
    ):
        self.loop = asyncio.new_event_loop()
        self.scheduler = Scheduler(model, set(), options, EngineStats(), cache=cache, draft=draft)
        # The timer's sizing only: the batch already reads its costs (Scheduler hands them at start).
        self.scheduler.timer.chunk = ScriptedChunks(chunks)  # type: ignore[method-assign]
        ticks = itertools.count()
        self.scheduler.clock = lambda: next(ticks) * 0.01  # speculation's step costs, by construction too
        self.logprobs: list[list[float]] = []  # of the last run, when it asked for them

    def run(self, batch: list[list[int]], n: int, *, logprobs: bool = False) -> tuple[list[list[int]], list[int]]:
        """Greedy answers of ``n`` tokens to ``batch`` submitted together, and the prompt tokens each
        took from the cache; with ``logprobs``, each written token's log-probability is kept in
        ``self.logprobs``, an answer's list each."""
        seqs = []
        for prompt in batch:
            params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=0 if logprobs else None)
            request = GenerationRequest(list(prompt), params)
            seq = Sequence(request, self.loop, IncrementalDetokenizer(_ids_text, request.prompt_tokens), set(), set())
            self.scheduler.inbox.put(seq)
            seqs.append(seq)
        for _ in range(MAX_STEPS):
            if all(s.finished for s in seqs):
                break
            if not self.scheduler.step():
                raise RuntimeError("the engine stopped before its requests finished")
        else:
            raise RuntimeError(f"the engine did not finish in {MAX_STEPS} steps")
        self.loop.call_soon(self.loop.stop)
        self.loop.run_forever()
        answers, self.logprobs = [], []
        for seq in seqs:
            text, written = "", []
            while not seq.events.empty():
                event = seq.events.get_nowait()
                text += getattr(event, "text", "")
                if isinstance(event, Logprobs) and not event.prompt:
                    written += [entry.logprob for entry in event.entries]
            answers.append([int(t) for t in re.findall(r"<(\d+)>", text)])
            self.logprobs.append(written)
        return answers, [s.progress.cached_tokens for s in seqs]

    @property
    def drafted(self) -> int:
        """Draft tokens verified so far (0 without speculation)."""
        spec = self.scheduler.spec
        return spec.stats.drafted if spec is not None else 0

    def close(self) -> None:
        self.scheduler.shutdown()
        self.loop.close()


def _ids_text(ids: list[int]) -> str:
    """Token ids as text (``<5><17>``), read back by ``Driver.run``: no tokenizer's merges between."""
    return "".join(f"<{i}>" for i in ids)
