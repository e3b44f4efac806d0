"""Pure translation of Anthropic requests into what the engine takes: OpenAI-style messages and
tools for the chat template (the shape templates are written for), the thinking switch, neutral
sampling; and of the engine's finish back into Anthropic's stop reason."""

from __future__ import annotations

from typing import Any

from ...engine.types import Finished
from ...errors import InvalidRequest
from ..hosted_tools import HostedTool
from ..images import ImageRef, image_part
from ..sampling import SamplingRequest
from ..structured import anthropic_output_format
from ..tooling import anthropic_tool_choice
from ..turn import ChatPrompt, ChatTurn, content_of, refuse_client_template, tool_result_text
from .protocol import (
    CallBlock,
    ContentBlock,
    CountTokensRequest,
    DocumentBlock,
    ImageBlock,
    McpToolResultBlock,
    MessagesRequest,
    RedactedThinkingBlock,
    ResultBlock,
    TextBlock,
    ThinkingBlock,
    Tool,
    ToolResultBlock,
)

# Blocks are separate segments (a system reminder, then the prompt); a blank line keeps them
# apart where gluing them would join the last word of one to the first of the next.
BLOCK_SEPARATOR = "\n\n"
_ASSISTANT_ONLY = (CallBlock, ThinkingBlock, RedactedThinkingBlock, McpToolResultBlock)


MESSAGE_ID_PREFIX = "msg_"


def to_prompt(req: CountTokensRequest) -> ChatPrompt:
    """What shapes the prompt (``/v1/messages`` and ``count_tokens`` alike)."""
    refuse_client_template(req.model_extra or {})
    messages, tools = to_template_messages(req)
    return ChatPrompt(messages, tools, thinking_switch(req))


def to_turn(req: MessagesRequest) -> ChatTurn:
    """A Messages request as the neutral turn ``api.chat.serve_chat`` serves, computed once."""
    choice = req.tool_choice
    return ChatTurn(
        to_prompt(req),
        sampling_request(req),
        MESSAGE_ID_PREFIX,
        tool_choice=anthropic_tool_choice(
            choice.type if choice else None,
            choice.name if choice else None,
            choice.disable_parallel_tool_use if choice else None,
        ),
        output=anthropic_output_format(req.output_format),
        stream=req.stream,
        hosted=hosted_tools(req.tools),
    )


def to_template_messages(req: CountTokensRequest) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """The conversation as chat-template messages, and the tools as OpenAI-style functions.

    The system prompt comes first; an assistant's ``tool_use`` blocks become its ``tool_calls``
    (arguments as objects: templates render them so) and its ``thinking`` its ``reasoning_content``;
    a user's ``tool_result`` blocks become ``tool`` messages, before any text of the same turn
    (Anthropic puts results first, and templates expect them right after the calls). Image
    blocks become image parts among the text (a text model refuses them when they are read:
    ``api.image_input``); documents are a 400 naming the block.
    """
    out: list[dict[str, Any]] = []
    system = _joined(req.system or [])
    if system:
        out.append({"role": "system", "content": system})
    names: dict[str, str] = {}  # tool_use id -> tool name, for templates that label results
    for i, msg in enumerate(req.messages):
        where = f"messages[{i}].content"
        for j, block in enumerate(msg.content):
            _check_block(block, msg.role, f"{where}[{j}]")
        if msg.role == "assistant":
            out.extend(_assistant_turns(msg.content, names, where))
            continue
        if msg.role == "system":
            # Most templates accept a system turn only first; moving it there would change the
            # prompt's start at every turn (no prefix cache hit), so it joins the user turn beside it.
            _add_user(out, _joined([b for b in msg.content if isinstance(b, TextBlock)]))
            continue
        for j, block in enumerate(msg.content):
            if isinstance(block, ResultBlock):
                out.append(_tool_message(block, names, f"{where}[{j}]"))
        pieces = _pieces(msg.content, where)
        if pieces or not msg.content:
            _add_user(out, content_of(pieces, BLOCK_SEPARATOR))
    return out, to_template_tools(req.tools)


def to_template_tools(tools: list[Tool] | None) -> list[dict[str, Any]] | None:
    """Anthropic's ``{name, description, input_schema}`` as OpenAI-style functions; None for no tools."""
    if not tools:
        return None
    out = []
    for i, tool in enumerate(tools):
        if is_hosted(tool):
            continue  # named on the turn (hosted_tools), not shown to the model
        if tool.input_schema is None:
            raise InvalidRequest(f"tools[{i}]: {tool.name!r} has no input_schema", param=f"tools[{i}].input_schema")
        function = {"name": tool.name, "description": tool.description or "", "parameters": tool.input_schema}
        out.append({"type": "function", "function": function})
    return out or None


def is_hosted(tool: Tool) -> bool:
    """Anthropic's own tools (``web_search_20250305``, ``code_execution_…``, ``bash_…``): typed, with
    no schema, run at Anthropic or in a form its models were trained on."""
    return tool.type not in (None, "custom")


def hosted_tools(tools: list[Tool] | None) -> tuple[HostedTool, ...]:
    return tuple(HostedTool(t.type or "", f"tools[{i}].type") for i, t in enumerate(tools or ()) if is_hosted(t))


def thinking_switch(req: CountTokensRequest) -> dict[str, bool]:
    """Chat-template kwargs for ``thinking``: on, off, or (absent, adaptive) the template's default."""
    kind = req.thinking.type if req.thinking else None
    if kind == "enabled":
        return {"enable_thinking": True}
    if kind == "disabled":
        return {"enable_thinking": False}
    return {}


def sampling_request(req: MessagesRequest) -> SamplingRequest:
    """The request's sampling fields, in no family's words."""
    return SamplingRequest(
        max_tokens=req.max_tokens,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        stop=tuple(req.stop_sequences or ()),
        seed=req.seed,
        logit_bias=dict(req.logit_bias or {}),
        min_p=req.min_p,
        repetition_penalty=req.repetition_penalty,
        speculative=req.speculative,
        cache_salt=req.cache_salt,
    )


def stop_reason(finished: Finished) -> tuple[str, str | None]:
    """Anthropic's ``(stop_reason, stop_sequence)`` for how the generation ended."""
    if finished.stop_sequence is not None:
        return "stop_sequence", finished.stop_sequence
    if finished.reason == "length":
        return "max_tokens", None
    if finished.reason == "tool_calls":
        return "tool_use", None
    return "end_turn", None  # EOS; a cancelled or failed generation is never encoded as a message


def _check_block(block: ContentBlock, role: str, param: str) -> None:
    if isinstance(block, DocumentBlock) or (isinstance(block, ImageBlock) and role != "user"):
        raise InvalidRequest(f"{param}: {block.type} blocks are not supported here", param=param)
    if role == "user" and isinstance(block, _ASSISTANT_ONLY):
        raise InvalidRequest(f"{param}: {block.type} blocks belong in assistant turns", param=param)
    if role == "assistant" and isinstance(block, ToolResultBlock):  # mcp_tool_result is an assistant's
        raise InvalidRequest(f"{param}: tool_result blocks belong in user turns", param=param)


def _assistant_turns(blocks: list, names: dict[str, str], where: str) -> list[dict[str, Any]]:
    """An assistant message, or, where this server ran tools in it (``server_tool_use`` then
    ``mcp_tool_result``), the turns the model really saw: calls, their results, the rest."""
    turns: list[dict[str, Any]] = []
    pending: list = []
    for j, block in enumerate(blocks):
        if isinstance(block, McpToolResultBlock):
            if pending:
                turns.append(_assistant(pending, names))
                pending = []
            turns.append(_tool_message(block, names, f"{where}[{j}]"))
        else:
            pending.append(block)
    if pending or not turns:
        turns.append(_assistant(pending, names))
    return turns


def _assistant(blocks: list, names: dict[str, str]) -> dict[str, Any]:
    item: dict[str, Any] = {"role": "assistant", "content": _joined([b for b in blocks if isinstance(b, TextBlock)])}
    thinking = [b.thinking for b in blocks if isinstance(b, ThinkingBlock)]
    if thinking:
        item["reasoning_content"] = BLOCK_SEPARATOR.join(thinking)  # redacted_thinking is opaque: dropped
    calls = [b for b in blocks if isinstance(b, CallBlock)]  # tool_use and server_tool_use
    if calls:
        item["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.input}} for c in calls
        ]
        names.update((c.id, c.name) for c in calls)
    return item


def _tool_message(block: ResultBlock, names: dict[str, str], param: str) -> dict[str, Any]:
    for k, part in enumerate(block.content):
        if isinstance(part, DocumentBlock):
            raise InvalidRequest(
                f"{param}.content[{k}]: document blocks are not supported here", param=f"{param}.content[{k}]"
            )
    text = tool_result_text(_joined([p for p in block.content if isinstance(p, TextBlock)]), block.is_error)
    images = [p for p in _pieces(block.content, f"{param}.content") if not isinstance(p, str)]
    item: dict[str, Any] = {
        "role": "tool",
        "tool_call_id": block.tool_use_id,
        "content": content_of([text, *images], BLOCK_SEPARATOR) if images else text,  # the text, then its images
    }
    if block.tool_use_id in names:
        item["name"] = names[block.tool_use_id]
    return item


def _pieces(blocks: list, where: str) -> list[str | dict[str, Any]]:
    """A turn's text and image blocks, in order: texts as strings, images as image parts."""
    out: list[str | dict[str, Any]] = []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            out.append(block.text)
        elif isinstance(block, ImageBlock):
            out.append(image_part(_image_ref(block.source, f"{where}[{j}]")))
    return out


def _image_ref(source: dict[str, Any], where: str) -> ImageRef:
    """An image block's source: base64 data with its media type, or a URL."""
    kind = source.get("type")
    if kind == "base64":
        return ImageRef(where, media_type=source.get("media_type"), data=source.get("data"))
    if kind == "url" and isinstance(source.get("url"), str):
        return ImageRef(where, url=source["url"])
    raise InvalidRequest(f"{where}.source: an image source must be base64 data or a url", param=f"{where}.source")


def _add_user(out: list[dict[str, Any]], content: str | list[dict[str, Any]]) -> None:
    """A user turn's content, joined to the user turn just before when there is one (templates
    expect turns to alternate)."""
    if out and out[-1]["role"] == "user":
        joined = [p for c in (out[-1]["content"], content) for p in _as_pieces(c)]
        out[-1] = {**out[-1], "content": content_of(joined, BLOCK_SEPARATOR)}
    else:
        out.append({"role": "user", "content": content})


def _as_pieces(content: str | list[dict[str, Any]]) -> list[str | dict[str, Any]]:
    if isinstance(content, str):
        return [content] if content else []
    return [p["text"] if p.get("type") == "text" else p for p in content]


def _joined(blocks: list[TextBlock]) -> str:
    return BLOCK_SEPARATOR.join(b.text for b in blocks)
