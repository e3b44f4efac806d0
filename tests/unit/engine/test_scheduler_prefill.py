"""scheduler.py's chunked prefill over the real BatchGenerator and a weightless model on a fake
clock: the step timer sizes each chunk, alone and beside streams; a chunk takes about a second
at most even where 512 tokens take a minute; progress and the step counter move chunk by chunk;
a cancel ends the work within the chunk in flight."""

from __future__ import annotations

import pytest

from tests.unit.engine.scheduler_fakes import Harness, counting
from vllmmlxd.engine.step.step_timer import GROWTH, MIN_CHUNK, PREFILL_SHARE

A_SECOND = 1.0  # the longest a chunk may take: progress and cancels are seen at least this often
SLOW = {"per_call": 0.010, "per_token": 0.1}  # one BLAS thread on a big model: 512 tokens cost 51 s


class Steps:
    """Steps the harness, recording per step: fake seconds, model calls, chunk asked of the timer, progress."""

    def __init__(self, h: Harness):
        self.h = h
        self.rows: list[dict] = []
        self.asked: list[tuple[int, bool, int]] = []  # (chunk, decoding, prompts) asked this step
        timer = h.scheduler.timer
        ask = timer.chunk

        def chunk(max_chunk: int, *, decoding: bool, prompts: int) -> int:
            got = ask(max_chunk, decoding=decoding, prompts=prompts)
            self.asked.append((got, decoding, prompts))
            return got

        timer.chunk = chunk  # type: ignore[method-assign]  # a spy on the chunks the timer answers

    def step(self, seq=None) -> dict:
        h = self.h
        calls, started, steps, self.asked = len(h.model.calls), h.clock.now, h.stats.steps_executed, []
        h.step()
        row = {
            "seconds": h.clock.now - started,
            "calls": h.model.calls[calls:],
            "asked": self.asked,
            "steps": h.stats.steps_executed - steps,
        }
        if seq is not None:
            row["progress"] = seq.progress.snapshot()["progress"]
        self.rows.append(row)
        return row

    def prefill(self, seq) -> list[dict]:
        """Step until ``seq`` has its first token; the rows of those steps."""
        first = len(self.rows)
        while seq.progress.first_token_at is None:
            assert len(self.rows) < 500
            self.step(seq)
        return self.rows[first:]


def test_a_prompt_alone_goes_in_chunks_the_timer_sizes_with_progress_at_each():
    h = Harness(prefill_step_size=64)
    seq = h.submit(counting(1, 300), max_tokens=2)
    rows = Steps(h).prefill(seq)
    chunks = [tokens for row in rows for _, tokens in row["calls"] if tokens > 1]
    asked = [row["asked"][0] for row in rows if row["asked"]]
    assert all(not decoding and prompts == 1 for _, decoding, prompts in asked)  # nothing else streams
    # A cheap first step, then a few times more a step up to the configured step.
    assert chunks[:3] == [MIN_CHUNK, GROWTH * MIN_CHUNK, 64] and set(chunks[2:-1]) == {64}
    assert chunks == [min(n, 299 - sum(chunks[:i])) for i, (n, _, _) in enumerate(asked[: len(chunks)])]
    assert sum(chunks) == 299  # the last prompt token is the first decode step's input
    progress = [row["progress"] for row in rows[:-1]]  # the last step gave the first token: generation
    assert progress == sorted(progress) and len(set(progress)) == len(progress)  # rises at every step
    assert all(row["steps"] == 1 for row in rows)


def test_beside_a_stream_a_prompt_advances_by_a_few_decode_steps_worth():
    h = Harness(prefill_step_size=64)  # a decode step: 0.02 + 0.001 s; a chunk of c tokens: 0.02 + 0.001 c
    streaming = h.submit(counting(1, 8), max_tokens=400)
    h.run_until(lambda: streaming.produced >= 3)
    steps = Steps(h)
    prompt = h.submit(counting(100, 300), max_tokens=2)
    rows = steps.prefill(prompt)
    *chunked, joined = rows  # the last step decodes both together
    assert joined["calls"] == [(2, 1)]
    # Each step: the stream's decode step first, then the prompt's chunk.
    assert all(row["calls"][0] == (1, 1) and len(row["calls"]) == 2 for row in chunked)
    assert all(decoding and prompts == 1 for row in chunked for _, decoding, prompts in row["asked"])
    decode_s = 0.02 + 0.001
    budget = int((PREFILL_SHARE * decode_s - 0.02) / 0.001)  # 11 tokens: the prefill takes 1.5 decode steps
    # (Rounding, and the feedback on each step's time, which settles about the budget.)
    assert all(budget - 1 <= row["calls"][1][1] <= budget + 1 for row in chunked[1:-2])
    gap = (1 + PREFILL_SHARE) * decode_s
    assert all(row["seconds"] <= gap + 0.001 + 1e-9 for row in chunked)  # the stream's gap stays about 2.5x
    # The prompt joins in a step of its own: the stream's decode and the prompt's first, no chunk.
    assert rows[-2]["calls"] == [(1, 1), (1, 1)]
    assert streaming.produced >= 3 + len(rows)  # it kept streaming, a token a step


def test_where_512_tokens_take_a_minute_a_chunk_still_takes_a_second_at_most():
    h = Harness(**SLOW)  # the default prefill_step_size, 512
    seq = h.submit(counting(1, 120), max_tokens=2)
    rows = Steps(h).prefill(seq)
    assert len(rows) > 10  # many chunks, not one 12-second step
    assert max(row["seconds"] for row in rows) <= A_SECOND
    progress = [row["progress"] for row in rows[:-1]]  # the last step gave the first token: generation
    assert progress == sorted(progress) and len(set(progress)) == len(progress)
    assert all(row["steps"] == 1 for row in rows)


def test_eight_prompts_at_once_share_the_second():
    h = Harness(max_num_seqs=8, **SLOW)
    seqs = [h.submit(counting(50 * i, 30), max_tokens=2) for i in range(8)]  # prefilled side by side
    steps = Steps(h)
    while any(s.progress.first_token_at is None for s in seqs):
        assert len(steps.rows) < 500
        steps.step()
    assert max(row["seconds"] for row in steps.rows) <= A_SECOND  # a token a prompt, not MIN_CHUNK each


def test_a_resent_history_prefills_its_new_part_in_chunks_of_a_second_too():
    h = Harness(**SLOW)
    first = h.submit(counting(1, 60), max_tokens=3)
    h.finish(first)
    history = [*counting(1, 60), 61, 62, 63]  # the prompt and the answer, cached whole
    seq = h.submit(history + counting(200, 60), max_tokens=2)
    rows = Steps(h).prefill(seq)
    assert seq.progress.cache_hit_type == "prefix" and seq.progress.cached_tokens == 63
    # Counting the cached tokens as prefilled would make a token look cheap and the next chunk long.
    assert max(row["seconds"] for row in rows) <= A_SECOND


@pytest.mark.parametrize("cancel_at", [0.5, 3.0, 7.3])
def test_a_cancel_during_a_chunk_ends_the_work_with_that_chunk(cancel_at):
    h = Harness(**SLOW)
    seq = h.submit(counting(1, 200), max_tokens=2)
    heard: list[tuple[float, int]] = []  # (fake time, calls so far) when the cancel came

    def hang_up(rows: int, tokens: int) -> None:  # the client goes away while this call runs
        if h.clock.now >= cancel_at and not heard:
            seq.request.cancelled.set()
            heard.append((h.clock.now, len(h.model.calls)))

    h.model.on_call = hang_up
    h.run_until(lambda: seq.finished is not None)
    assert seq.finished == "cancelled" and heard
    at, calls = heard[0]
    assert len(h.model.calls) == calls  # the chunk in flight was the last model call
    assert h.clock.now - at <= A_SECOND  # so the work ended within a second of the cancel
    h.step()
    assert len(h.model.calls) == calls and not h.scheduler.running


class Watching:
    """A stand-in for the stats lock that notes (step count, the prompt's progress) as each
    holder takes and gives it back."""

    def __init__(self, h: Harness, seq):
        self.h, self.seq = h, seq
        self.notes: list[tuple[str, int, int]] = []

    def note(self, when: str) -> None:
        self.notes.append((when, self.h.stats.steps_executed, self.seq.progress.prefilled_tokens))

    def __enter__(self):
        self.note("taken")

    def __exit__(self, *exc):
        self.note("given")


def test_a_step_changes_its_count_and_its_prompts_progress_together_under_the_stats_lock():
    h = Harness(prefill_step_size=64)
    seq = h.submit(counting(1, 300), max_tokens=2)
    watching = h.stats.lock = Watching(h, seq)
    Steps(h).prefill(seq)
    notes = watching.notes
    assert [w for w, _, _ in notes] == ["taken", "given"] * (len(notes) // 2) and len(notes) >= 8
    # Between two holds (where /v1/status may read) neither changes: the next hold finds them as left.
    assert all(a[1:] == b[1:] for a, b in zip(notes[1::2], notes[2::2], strict=False))
    # Inside each hold the count moves by one, and the progress with it while the prompt is prefilled.
    assert all(b[1] == a[1] + 1 for a, b in zip(notes[::2], notes[1::2], strict=True))
    assert all(b[2] > a[2] for a, b in list(zip(notes[::2], notes[1::2], strict=True))[:-1])
