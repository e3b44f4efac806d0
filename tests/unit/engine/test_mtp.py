"""Multi-token-prediction drafts (engine/speculation/mtp.py): a Qwen3.5-shaped checkpoint that
carries its MTP layer (random weights, made here) drafts inside the batch; answers stay mlx-lm's."""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model

from tests.support import fidelity
from tests.support.families import make, save
from vllmmlxd.engine.options import SpeculationOptions
from vllmmlxd.engine.speculation.mtp import CENTRED_NORMS, MTPDrafter, load_mtp

ANSWER = 24
# Qwen3.5's MTP tensors as its checkpoints name them (Qwen/Qwen3.5-*, model.safetensors.index.json).
QWEN3_5_MTP = {
    "mtp.fc.weight",
    "mtp.norm.weight",
    "mtp.pre_fc_norm_embedding.weight",
    "mtp.pre_fc_norm_hidden.weight",
    "mtp.layers.0.input_layernorm.weight",
    "mtp.layers.0.post_attention_layernorm.weight",
    "mtp.layers.0.self_attn.q_proj.weight",
    "mtp.layers.0.self_attn.k_proj.weight",
    "mtp.layers.0.self_attn.v_proj.weight",
    "mtp.layers.0.self_attn.o_proj.weight",
    "mtp.layers.0.self_attn.q_norm.weight",
    "mtp.layers.0.self_attn.k_norm.weight",
    "mtp.layers.0.mlp.gate_proj.weight",
    "mtp.layers.0.mlp.up_proj.weight",
    "mtp.layers.0.mlp.down_proj.weight",
}


def checkpoint(
    tmp: Path, precision: str, cycle: range | None = None, family: str = "qwen3_5"
) -> tuple[object, MTPDrafter]:
    path = save(family, precision, tmp / f"{family}-{precision}", mtp=True, cycle=cycle)  # type: ignore[arg-type]
    model, _ = load_model(path)
    drafter = load_mtp(path, model)
    assert drafter is not None
    return model, drafter


def run(model: object, drafter: MTPDrafter, prompts: list[list[int]]) -> tuple[list[list[int]], object]:
    spec = SpeculationOptions(method="mtp", num_draft=3, adaptive=False)
    driver = fidelity.Driver(model, fidelity.options(None, cache_budget_bytes=0, speculative=spec), draft=drafter)
    try:
        answers, _ = driver.run(prompts)
        batch = driver.scheduler.spec
    finally:
        driver.close()
    return answers, batch


def test_the_checkpoint_s_mtp_layer_is_named_as_qwen3_5_s_are(tmp_path):
    path = save("qwen3_5", "float32", tmp_path / "m", mtp=True)
    assert {k for k in mx.load(str(path / "model.safetensors")) if k.startswith("mtp.")} == QWEN3_5_MTP


def test_a_predictable_model_s_mtp_drafts_are_all_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(fidelity, "GENERATE", ANSWER)
    cycle = range(100, 160)
    model, drafter = checkpoint(tmp_path, "float32", cycle)
    prompts = [[*cycle, *cycle[:30]], [*cycle[:50], *cycle, *cycle[:7]]]  # no repeat to look up in the second
    answers, batch = run(model, drafter, prompts)
    assert answers[0] == [cycle[(30 + i) % 60] for i in range(ANSWER)]
    assert answers[1] == [cycle[(7 + i) % 60] for i in range(ANSWER)]
    assert batch.stats.drafted > ANSWER and batch.stats.accepted == batch.stats.drafted


@pytest.mark.parametrize(
    "family,precision",
    [("qwen3_5", "float32"), ("qwen3_5", "q4"), ("qwen3_5_moe", "float32")],
)
def test_random_mtp_drafts_keep_the_answers_mlx_lm_s(family, precision, tmp_path, monkeypatch):
    monkeypatch.setattr(fidelity, "GENERATE", ANSWER)
    model, drafter = checkpoint(tmp_path, precision, family=family)
    prompts = fidelity.prompts()[:3]
    refs = [fidelity.reference(model, p, ANSWER) for p in prompts]
    answers, batch = run(model, drafter, prompts)
    report = fidelity.Report(family, precision)
    if precision != "float32":
        report.rounding = fidelity.noise(model, prompts[2], refs[2].tokens)
    fidelity.compare(report, "batched", refs, answers)
    assert not report.failures, report.summary()
    assert batch.stats.drafted > 0  # every row drafted from its second step on (not adaptive)


def unconverted(weights: dict[str, mx.array]) -> dict[str, mx.array]:
    """A converted checkpoint's MTP weights as the original checkpoint holds them: zero-centred
    norms, and a MoE layer's experts in one gate-and-up tensor and one down tensor."""
    out = {}
    for k, v in weights.items():
        if not k.startswith("mtp."):
            continue
        if ".switch_mlp.gate_proj." in k:
            up = weights[k.replace("gate_proj", "up_proj")]
            out[k.replace("switch_mlp.gate_proj.weight", "experts.gate_up_proj")] = mx.concatenate([v, up], axis=-2)
        elif ".switch_mlp.down_proj." in k:
            out[k.replace("switch_mlp.down_proj.weight", "experts.down_proj")] = v
        elif ".switch_mlp." not in k:
            out[k] = v - 1.0 if CENTRED_NORMS.search(k[4:]) else v
    return out


@pytest.mark.parametrize("family", ["qwen3_5", "qwen3_5_moe"])
def test_an_unconverted_checkpoint_s_mtp_layer_loads_as_a_converted_one(family, tmp_path):
    converted = save(family, "float32", tmp_path / "mlx", mtp=True)
    weights = mx.load(str(converted / "model.safetensors"))
    original = tmp_path / "hf"
    original.mkdir()
    (original / "config.json").write_text((converted / "config.json").read_text())
    mx.save_safetensors(str(original / "model.safetensors"), unconverted(weights), metadata={"format": "pt"})
    model, _ = load_model(converted)
    ours, theirs = load_mtp(converted, model), load_mtp(original, model)
    assert ours is not None and theirs is not None
    a, b = dict(tree_flatten(ours.layers.parameters())), dict(tree_flatten(theirs.layers.parameters()))
    assert any("switch_mlp" in k for k in a) == (family == "qwen3_5_moe")
    assert a.keys() == b.keys() and all(mx.allclose(a[k], b[k]).item() for k in a)


def test_a_checkpoint_without_mtp_layers_has_no_drafter(tmp_path):
    path = save("qwen3_5", "float32", tmp_path / "plain")
    model, _ = load_model(path)
    assert load_mtp(path, model) is None
    llama, _ = make("llama", "float32")
    assert load_mtp(path, llama) is None  # not a family whose MTP layer this engine builds
