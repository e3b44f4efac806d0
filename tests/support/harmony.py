"""A GPT-OSS stand-in for the harmony format's tests: a tokenizer carrying harmony's special tokens
(byte-level BPE, trained here on a few sentences), a chat template that renders conversations in
harmony (written from OpenAI's description of the format: system, developer with the tools,
user, assistant messages on their channels, tool results from ``functions.NAME``), and a model
that writes a scripted transcript through the real engine.

The model has no weights: the engine's KV holds the token ids it was fed (as the scheduler's
fakes do), and the next token is read off the script. Where its answer starts is where the
history last ends with the generation prompt ``<|start|>assistant`` and what follows is a start
of the script (the earliest such); a conversation that holds a tool's result gets the second
script. What is under
test is the format's parsing and rendering by the engine and the four API families, not
numerics: the model is the one fake.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import mlx.core as mx
from mlx import nn
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = [
    "<|endoftext|>",
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|constrain|>",
    "<|return|>",
    "<|call|>",
]
REASONING_1 = "The user asks about the weather in Paris. I should call the weather tool."
REASONING_2 = "The tool says it is sunny and 21 degrees. I can answer now."
ANSWER = "It is sunny in Paris, 21 degrees."
LOST = "My reasoning before the call was not rendered back."
ARGUMENTS = {"city": "Paris"}
RESULT = {"forecast": "sunny", "celsius": 21}
TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CORPUS = [REASONING_1, REASONING_2, ANSWER, LOST, json.dumps(ARGUMENTS), json.dumps(RESULT), "What is the weather in Paris?",
          "system developer user assistant analysis commentary final to=functions.get_weather json tools weather city",
          "You are a helpful assistant. Reasoning: medium. Tools: namespace functions type get_weather = (_: {",
          "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;!?'\"{}[]()<>=_-/\n"]  # fmt: skip

TEMPLATE = """
{%- set ns = namespace(tool='') -%}
<|start|>system<|message|>You are a helpful assistant. Reasoning: medium.<|end|>
{%- if tools -%}<|start|>developer<|message|>Tools: namespace functions {
{%- for t in tools %} type {{ t.function.name }} = (_: {{ t.function.parameters | tojson }}) => any; {% endfor -%}
}<|end|>{%- endif -%}
{%- for m in messages -%}
{%- if m.role in ('system', 'developer') -%}<|start|>developer<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'user' -%}<|start|>user<|message|>{{ m.content }}<|end|>
{%- elif m.role == 'assistant' -%}
{%- if m.thinking -%}<|start|>assistant<|channel|>analysis<|message|>{{ m.thinking }}<|end|>{%- endif -%}
{%- if m.tool_calls -%}{%- for c in m.tool_calls -%}{%- set ns.tool = c.function.name -%}
<|start|>assistant<|channel|>commentary to=functions.{{ c.function.name }} <|constrain|>json<|message|>
{%- if c.function.arguments is string -%}{{ c.function.arguments }}{%- else -%}{{ c.function.arguments | tojson }}{%- endif -%}
<|call|>{%- endfor -%}
{%- elif m.content -%}<|start|>assistant<|channel|>final<|message|>{{ m.content }}<|end|>{%- endif -%}
{%- elif m.role == 'tool' -%}<|start|>functions.{{ ns.tool }} to=assistant<|channel|>commentary<|message|>{{ m.content }}<|end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}
"""


def make_tokenizer(dest: Path) -> Path:
    """A folder holding the tokenizer (tokenizer.json, tokenizer_config.json with the template)."""
    dest.mkdir(parents=True, exist_ok=True)
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIALS, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(CORPUS * 4, trainer)
    tokenizer.save(str(dest / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "chat_template": TEMPLATE.strip(),
        "eos_token": "<|return|>",
        "pad_token": "<|endoftext|>",
        "additional_special_tokens": SPECIALS,
        "model_max_length": 4096,
    }
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return dest


def scripts(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The two transcripts as token ids: reasoning and a call; reasoning and the answer."""

    def ids(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    call = (
        f"<|channel|>analysis<|message|>{REASONING_1}<|end|><|start|>assistant<|channel|>commentary "
        f"to=functions.get_weather <|constrain|>json<|message|>{json.dumps(ARGUMENTS)}<|call|>"
    )
    answer = f"<|channel|>analysis<|message|>{REASONING_2}<|end|><|start|>assistant<|channel|>final<|message|>{ANSWER}<|return|>"
    return ids(call), ids(answer)


class ScriptedModel(nn.Module):
    """Writes ``first`` as its answer; where the conversation holds a tool's result, ``second`` if
    its reasoning before the call was rendered back too, else ``lost``."""

    def __init__(self, vocab: int, transcripts: dict[str, list[int]], marks: dict[str, list[int]]):
        super().__init__()
        self.layers = [nn.Identity(), nn.Identity()]  # make_prompt_cache makes a KVCache a layer
        self.vocab, self.transcripts, self.marks = vocab, transcripts, marks

    def __call__(self, inputs: mx.array, cache: list | None = None, **kwargs: Any) -> mx.array:
        rows, length = inputs.shape
        kv = inputs.astype(mx.float32)[:, None, :, None]
        keys = kv
        for layer in cache or []:
            keys, _ = layer.update_and_fetch(kv, kv)
        history = cast(list[list[int]], keys[:, 0, :, 0].astype(mx.int32).tolist())  # 2-D: a list per row
        offsets = [0] * rows
        if cache and hasattr(cache[0], "left_padding"):  # a batch: rows are left-padded
            offsets = [max(int(p), 0) for p in cache[0].left_padding.tolist()]
        # Only a call's last position is read (a prompt's chunk, or one decoding step).
        choice = mx.array([self._next(row[pad:]) for row, pad in zip(history, offsets)])
        logits = mx.where(choice[:, None] == mx.arange(self.vocab), 1e4, -1e4)
        return mx.broadcast_to(logits[:, None], (rows, length, self.vocab))

    def _pick(self, prompt: list[int]) -> list[int]:
        if not _contains(prompt, self.marks["result"]):
            return self.transcripts["first"]
        return self.transcripts["second" if _contains(prompt, self.marks["reasoning"]) else "lost"]

    def _next(self, seen: list[int]) -> int:
        boundary = self.marks["boundary"]
        n = len(boundary)
        # The earliest generation prompt after which all that follows is a start of the script: an
        # earlier assistant turn runs past its script, and the answer's own later messages open
        # with <|start|>assistant too.
        for at in range(len(seen) - n + 1):
            if seen[at : at + n] != boundary:
                continue
            script, done = self._pick(seen[:at]), len(seen) - at - n
            if done <= len(script) and script[:done] == seen[at + n :]:
                return script[done] if done < len(script) else script[-1]
        return self.transcripts["first"][-1]


def scripted_model(tokenizer: Any) -> ScriptedModel:
    def ids(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    first, second = scripts(tokenizer)
    lost = ids(f"<|channel|>final<|message|>{LOST}<|return|>")
    marks = {"boundary": ids("<|start|>assistant"), "result": ids("<|start|>functions"), "reasoning": ids(REASONING_1)}
    return ScriptedModel(len(tokenizer.get_vocab()), {"first": first, "second": second, "lost": lost}, marks)


def _contains(seen: list[int], mark: list[int]) -> bool:
    n = len(mark)
    return any(seen[i : i + n] == mark for i in range(len(seen) - n + 1))
