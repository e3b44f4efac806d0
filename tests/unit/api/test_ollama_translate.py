"""Unit tests of Ollama's translation: options onto neutral sampling (unknown ones ignored, known
ones checked by name), format, think, keep_alive, the refused fields, and messages (calls sent back,
their results matched) as the chat template takes them."""

import pytest

from vllmmlxd.api.ollama import translate as tr
from vllmmlxd.api.ollama.protocol import ChatRequest, GenerateRequest
from vllmmlxd.api.sampling import SamplingRequest
from vllmmlxd.errors import InvalidRequest

TEXT = tr.Model("tiny", reasoning=False)
THINKER = tr.Model("qwen", reasoning=True)


def test_options_map_onto_sampling_and_unknown_ones_are_ignored():
    options = {
        "temperature": 0.2,
        "top_p": 0.9,
        "top_k": 40,
        "min_p": 0.05,
        "num_predict": 128.0,
        "stop": ["\n\n", "User:"],
        "seed": 42,
        "repeat_penalty": 1.1,
        "presence_penalty": 0.5,
        "frequency_penalty": -0.5,
        "num_ctx": 4096,
        "num_gpu": 99,
        "mirostat": 2,
        "made_up": "x",
    }
    assert tr.sampling(options) == SamplingRequest(
        max_tokens=128,
        temperature=0.2,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        repetition_penalty=1.1,
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        seed=42,
        stop=("\n\n", "User:"),
        context_window=4096,
    )
    assert tr.sampling(None) == SamplingRequest() == tr.sampling({"temperature": None})


@pytest.mark.parametrize("value, max_tokens", [(-1, tr.UNBOUNDED), (-2, tr.UNBOUNDED), (1, 1)])
def test_num_predict_without_limit_is_as_many_as_allowed(value, max_tokens):
    assert tr.sampling({"num_predict": value}).max_tokens == max_tokens


def test_seed_minus_one_is_no_seed_and_a_lone_stop_string_is_one_stop():
    assert tr.sampling({"seed": -1}).seed is None
    assert tr.sampling({"stop": "END"}).stop == ("END",)


@pytest.mark.parametrize(
    "options, named",
    [
        ({"temperature": "hot"}, "temperature"),
        ({"temperature": -1}, "temperature"),
        ({"temperature": True}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -3}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
        ({"min_p": 2}, "min_p"),
        ({"num_predict": 0}, "num_predict"),
        ({"num_predict": -3}, "num_predict"),
        ({"seed": "7"}, "seed"),
        ({"stop": [1]}, "stop"),
        ({"stop": ["x"] * 17}, "stop"),
        ({"repeat_penalty": 0}, "repeat_penalty"),
        ({"presence_penalty": 3}, "presence_penalty"),
        ({"frequency_penalty": float("nan")}, "frequency_penalty"),
        ({"num_ctx": 0}, "num_ctx"),
    ],
)
def test_a_known_option_with_a_bad_value_is_a_400_naming_it(options, named):
    with pytest.raises(InvalidRequest) as refused:
        tr.sampling(options)
    assert refused.value.param == f"options.{named}" and named in refused.value.message


def test_format_json_or_a_schema():
    assert tr.output_format(None) is None and tr.output_format("") is None
    assert tr.output_format("json").schema == {"type": "object"}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    assert tr.output_format(schema).schema == schema and tr.output_format(schema).param == "format"
    for bad in ("yaml", {"type": "no-such-type"}):
        with pytest.raises(InvalidRequest):
            tr.output_format(bad)


def test_think_switches_reasoning_and_a_model_without_it_refuses():
    assert tr.thinking(None, TEXT) == {}
    assert tr.thinking(False, TEXT) == {"enable_thinking": False}
    assert tr.thinking(True, THINKER) == tr.thinking("high", THINKER) == {"enable_thinking": True}
    with pytest.raises(InvalidRequest, match="'tiny' does not support thinking"):
        tr.thinking(True, TEXT)
    with pytest.raises(InvalidRequest):
        tr.thinking("maximum", THINKER)


@pytest.mark.parametrize(
    "value, seconds",
    [
        (None, None),
        (0, 0.0),
        ("0", 0.0),
        (30, 30.0),
        ("30", 30.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5s", 1.5),
        ("500ms", 0.5),
        (-1, -1.0),
        ("-1m", -1.0),
        ("-1", -1.0),
    ],
)
def test_keep_alive_in_seconds(value, seconds):
    assert tr.keep_alive_s(value) == seconds


@pytest.mark.parametrize("value", ["soon", "5 minutes", "m", "1d", float("inf")])
def test_a_bad_keep_alive_is_a_400(value):
    with pytest.raises(InvalidRequest) as refused:
        tr.keep_alive_s(value)
    assert refused.value.param == "keep_alive"


def test_messages_with_calls_sent_back_and_their_results():
    req = ChatRequest.model_validate(
        {
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Weather and time?"},
                {
                    "role": "assistant",
                    "content": "",
                    "thinking": "two tools",
                    "tool_calls": [
                        {"function": {"name": "get_time", "arguments": {"zone": "CET"}}},
                        {"function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                    ],
                },
                {"role": "tool", "tool_name": "get_weather", "content": "12 degrees"},
                {"role": "tool", "content": "10:00"},
            ]
        }
    )
    out = tr.to_template_messages(req.messages, TEXT)
    assert out[:2] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Weather and time?"}]
    calls = out[2]["tool_calls"]
    assert out[2]["reasoning_content"] == "two tools"
    assert [c["function"]["arguments"] for c in calls] == [{"zone": "CET"}, {"city": "Paris"}]
    # The result naming its tool answers that call; the unnamed one the call left.
    assert out[3] == {"role": "tool", "content": "12 degrees", "tool_call_id": calls[1]["id"], "name": "get_weather"}
    assert out[4] == {"role": "tool", "content": "10:00", "tool_call_id": calls[0]["id"], "name": "get_time"}


def test_images_become_image_parts_before_the_text():
    from vllmmlxd.api.images import ImageRef

    req = ChatRequest.model_validate({"messages": [{"role": "user", "content": "What is it?", "images": ["aGk="]}]})
    (message,) = tr.chat_turn(req, TEXT).prompt.messages
    image, text = message["content"]
    assert image == {"type": "image", "image": ImageRef("messages[0].images[0]", data="aGk=")}
    assert text == {"type": "text", "text": "What is it?"}
    turn = tr.generate_turn(GenerateRequest.model_validate({"prompt": "?", "images": ["aGk="]}), TEXT)
    assert turn.prompt.messages[0]["content"][0]["image"].where == "images[0]"


def test_a_chat_turn_streams_by_default_and_takes_tool_choice():
    turn = tr.chat_turn(ChatRequest.model_validate({"messages": [{"role": "user", "content": "hi"}]}), TEXT)
    assert turn.stream and turn.tool_choice.mode == "auto" and turn.output is None
    forced = ChatRequest.model_validate({"messages": [], "stream": False, "tool_choice": "required", "format": "json"})
    turn = tr.chat_turn(forced, TEXT)
    assert not turn.stream and turn.tool_choice.mode == "required" and turn.output is not None


def test_generate_is_the_system_prompt_and_the_prompt_as_one_turn():
    turn = tr.generate_turn(GenerateRequest.model_validate({"prompt": "Hi", "system": "Be brief."}), TEXT)
    assert turn.prompt.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]


@pytest.mark.parametrize(
    "body, named",
    [
        ({"suffix": "return x"}, "suffix"),
        ({"template": "{{ .Prompt }}"}, "template"),
        ({"context": [1, 2, 3]}, "context"),
        ({"raw": True, "system": "x"}, "system"),
        ({"raw": True, "think": True}, "think"),
        ({"raw": True, "images": ["aGk="]}, "images"),
    ],
)
def test_generate_fields_this_server_does_not_serve_are_400s_naming_them(body, named):
    with pytest.raises(InvalidRequest) as refused:
        tr.refuse_generate_fields(GenerateRequest.model_validate({"prompt": "x", **body}))
    assert refused.value.param == named


@pytest.mark.parametrize(
    "body, asked",
    [({}, None), ({"logprobs": True}, 0), ({"logprobs": True, "top_logprobs": 3}, 3), ({"top_logprobs": 2}, 2)],
)
def test_logprobs_and_top_logprobs_ask_for_log_probabilities(body, asked):
    assert tr.request_sampling(GenerateRequest.model_validate({"prompt": "x", **body})).logprobs == asked


def test_num_ctx_is_the_requests_own_window_within_the_models():
    from vllmmlxd.api.sampling import resolve_sampling
    from vllmmlxd.config.schema import ModelConfig
    from vllmmlxd.errors import ContextLengthExceeded

    cfg = ModelConfig(model="builtin:tiny", max_tokens=100, max_request_tokens=5000)

    def resolve(options, prompt_len=10, ctx=1000):
        return resolve_sampling(tr.sampling(options), cfg, prompt_len=prompt_len, context_length=ctx, vocab_size=50)

    assert resolve({"num_ctx": 50, "num_predict": -1}).max_tokens == 40  # the window's room
    assert resolve({"num_ctx": 99999, "num_predict": -1}).max_tokens == 990  # no more than the model's
    with pytest.raises(ContextLengthExceeded, match="the request's context window is 8 tokens"):
        resolve({"num_ctx": 8})
