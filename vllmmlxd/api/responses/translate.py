"""Pure translation of a Responses request into the neutral turn ``api.chat.serve_chat`` serves.

Input items become the chat template's messages through the chat family's own translation
(``openai.translate.to_template_messages``): ``instructions`` a system message, a message item
its role's message, ``function_call`` items an assistant message's tool calls, and
``function_call_output`` items tool messages. Flat function tools become chat tools; hosted
tools (``web_search``…) are left out and named on the turn (``api.hosted_tools``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from ...errors import InvalidRequest
from ..files import file_text
from ..hosted_tools import HostedTool
from ..images import ImageRef, image_part
from ..openai.protocol import ChatMessage
from ..openai.translate import extended_sampling, refuse_fields, to_template_messages
from ..structured import openai_output_format
from ..tooling import openai_tool_choice
from ..turn import ChatPrompt, ChatTurn, content_of
from .ids import PREFIX
from .protocol import ResponsesRequest

# OpenAI's built-in tools: run at the provider, or in a form the model was trained on there;
# this server offers none of them. (``custom`` tools, free-form input, are the client's: a 400.)
HOSTED_TOOLS = frozenset(
    {
        "web_search",
        "web_search_preview",
        "file_search",
        "computer_use_preview",
        "computer_use",
        "code_interpreter",
        "image_generation",
        "local_shell",
        "shell",
        "apply_patch",
        "mcp",
    }
)
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
# What ``include`` may ask for. Reasoning items then carry ``encrypted_content`` (Codex asks for
# it on every turn, with ``store: false``).
# ``message.output_text.logprobs``: each message's tokens' log-probabilities (``top_logprobs`` candidates each).
INCLUDABLE = frozenset({"reasoning.encrypted_content", "message.output_text.logprobs"})


def joined(space: str, name: str) -> str:
    """How a namespace's tool is named to the model: ``crm.find_customer``."""
    return f"{space}.{name}"


def input_items(req: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's own input as items (a string is one user message)."""
    if isinstance(req.input, str):
        return [{"type": "message", "role": "user", "content": req.input}]
    if not req.input:
        raise InvalidRequest("input must not be empty", param="input")
    return list(req.input)


def to_turn(
    req: ResponsesRequest,
    history: list[dict[str, Any]] = (),  # type: ignore[assignment]
    prefix: str = PREFIX,
) -> ChatTurn:
    """The request as a chat turn, after the earlier turns of ``previous_response_id`` (``history``,
    as input items), its ids starting with ``prefix``; what this server would not honour is a 400 first."""
    refuse_unhonoured(req)
    messages = to_template_messages(chat_messages(req, list(history)))
    tools = chat_tools(req.tools)
    return ChatTurn(
        ChatPrompt(messages, tools, None),
        replace(extended_sampling(req, req.max_output_tokens), logprobs=asked_logprobs(req)),
        prefix,
        tool_choice=openai_tool_choice(_choice(req.tool_choice), req.parallel_tool_calls),
        output=openai_output_format(req.text.format if req.text else None, "text.format", flat=True),
        stream=req.stream,
        truncate=req.truncation == "auto",
        hosted=hosted_tools(req.tools),
    )


# Fields OpenAI defines that this server does not act on, with the values that ask for nothing.
UNHONOURED = {
    "background": lambda v: v in (None, False),  # a response run after the request returns
    "conversation": lambda v: v is None,  # OpenAI's Conversations API: previous_response_id here
    "prompt": lambda v: v is None,  # a prompt template stored at OpenAI
}


def asked_logprobs(req: ResponsesRequest) -> int | None:
    """Log-probabilities with this many candidates each (``include`` asks, or ``top_logprobs`` > 0), or None."""
    if "message.output_text.logprobs" in (req.include or ()) or req.top_logprobs:
        return req.top_logprobs or 0
    return None


def refuse_unhonoured(req: ResponsesRequest) -> None:
    declared = {"background": req.background}
    refuse_fields({**(req.model_extra or {}), **declared}, UNHONOURED)
    for i, name in enumerate(req.include or ()):
        if name not in INCLUDABLE:
            raise InvalidRequest(
                f"include[{i}]: {name!r} is not supported by this server; it can include "
                + ", ".join(sorted(INCLUDABLE)),
                param="include",
            )


def chat_messages(req: ResponsesRequest, history: list[dict[str, Any]]) -> list[ChatMessage]:
    """Instructions (this request's: an earlier response's are not carried over, as OpenAI does),
    the earlier turns, then the input items, as chat messages."""
    out: list[dict[str, Any]] = []
    if req.instructions:
        out.append({"role": "system", "content": req.instructions})
    for i, item in enumerate(history):
        _add_item(out, item, f"previous_response_id's input[{i}]")
    for i, item in enumerate(input_items(req)):
        _add_item(out, item, f"input[{i}]")
    # Reasoning no call or answer followed: nothing to carry it to the template.
    out = [m for m in out if not (m["role"] == "assistant" and m.get(_REASONING_ONLY))]
    for m in out:
        m.pop(_REASONING_ONLY, None)
    return [ChatMessage.model_validate(m) for m in out]


_REASONING_ONLY = "_reasoning_only"  # an assistant turn holding an earlier reasoning item alone, so far


def _add_item(out: list[dict[str, Any]], item: Any, where: str) -> None:
    if not isinstance(item, dict):
        raise InvalidRequest(f"{where} must be an object", param=where)
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = item.get("role")
        if role not in ("user", "assistant", "system", "developer"):
            raise InvalidRequest(f"{where}.role must be user, assistant, system or developer", param=f"{where}.role")
        content = _text(item.get("content"), f"{where}.content")
        last = out[-1] if out else None
        if role == "assistant" and last is not None and last.pop(_REASONING_ONLY, False):
            last["content"] = content  # the answer its reasoning came before
        else:
            out.append({"role": role, "content": content})
    elif kind == "function_call":
        call = {
            "id": _string(item, "call_id", where),
            "type": "function",
            "function": {"name": _called(item, where), "arguments": item.get("arguments") or "{}"},
        }
        last = out[-1] if out else None
        if last is not None and last["role"] == "assistant" and "tool_calls" in last:
            last["tool_calls"].append(call)  # consecutive calls: one assistant turn
        elif last is not None and last["role"] == "assistant" and not last.get("tool_calls"):
            last.pop(_REASONING_ONLY, None)
            last["tool_calls"] = [call]  # the text (or reasoning) the calls came with
        else:
            out.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        text = output if isinstance(output, str) else _text(output, f"{where}.output")
        out.append({"role": "tool", "tool_call_id": _string(item, "call_id", where), "content": text})
    elif kind == "reasoning":
        # The model's earlier thinking, for the turn it came before: templates that render it
        # (GPT-OSS's, before a call whose result follows) read it as that turn's reasoning.
        text = _reasoning_text(item)
        if text:
            out.append({"role": "assistant", "content": None, "reasoning_content": text, _REASONING_ONLY: True})
    else:
        raise InvalidRequest(
            f"{where}.type {kind!r} is not supported; use message, function_call, function_call_output or reasoning",
            param=f"{where}.type",
        )


def _reasoning_text(item: dict) -> str:
    """A reasoning item's text: its reasoning text parts, else its summary's."""
    for key in ("content", "summary"):
        parts = item.get(key)
        if isinstance(parts, list):
            text = "".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))
            if text:
                return text
    return ""


def _called(item: dict, where: str) -> str:
    """The name the model knows an earlier call's function by (its namespace's, if it has one)."""
    name = _string(item, "name", where)
    space = item.get("namespace")
    return joined(space, name) if isinstance(space, str) and space else name


def _string(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidRequest(f"{where}.{key} must be a non-empty string", param=f"{where}.{key}")
    return value


def _text(content: Any, where: str) -> str | list[dict[str, Any]]:
    """A message's content: a string, or text parts (input_text, output_text) joined; with
    ``input_image`` parts, text and image parts in their order."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise InvalidRequest(f"{where} must be a string or a list of content parts", param=where)
    pieces: list[str | dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            pieces.append(part["text"])
        elif kind == "input_image" and isinstance(part.get("image_url"), str) and part["image_url"]:
            pieces.append(image_part(ImageRef(f"{where}[{j}]", url=part["image_url"])))
        elif kind == "input_image":
            raise InvalidRequest(
                f"{where}[{j}]: an input_image needs an image_url (a data: or http(s):// URL); file_id is not supported",
                param=f"{where}[{j}]",
            )
        elif kind == "input_file":
            pieces.append(file_text(part, f"{where}[{j}]"))
        elif kind == "input_audio":
            raise InvalidRequest(f"{where}[{j}]: {kind} parts are not supported by this server", param=f"{where}[{j}]")
        else:
            raise InvalidRequest(f"{where}[{j}] must be an input_text or output_text part", param=f"{where}[{j}]")
    return content_of(pieces, "")


def hosted_tools(tools: list[dict[str, Any]] | None) -> tuple[HostedTool, ...]:
    """The hosted tools the request names, where it names them."""
    return tuple(
        HostedTool(tool["type"], f"tools[{i}].type")
        for i, tool in enumerate(tools or ())
        if isinstance(tool, dict) and tool.get("type") in HOSTED_TOOLS
    )


def chat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]] | None:
    """Function tools as chat tools, a namespace's each named ``namespace.name``; hosted tools
    left out (``hosted_tools`` names them)."""
    out = []
    for i, tool in enumerate(tools or ()):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind in HOSTED_TOOLS:
            continue
        if kind == "namespace" and isinstance(tool.get("name"), str) and isinstance(tool.get("tools"), list):
            for j, inner in enumerate(tool["tools"]):
                out.append(_chat_tool(inner, f"tools[{i}].tools[{j}]", tool["name"], tool.get("description")))
        else:
            out.append(_chat_tool(tool, f"tools[{i}]"))
    return out or None


def _chat_tool(tool: Any, where: str, space: str | None = None, about: str | None = None) -> dict[str, Any]:
    kind = tool.get("type") if isinstance(tool, dict) else None
    if kind == "custom":
        raise InvalidRequest(
            f"{where}: custom (free-form) tools are not supported; use function tools", param=f"{where}.type"
        )
    if kind != "function" or not isinstance(tool.get("name"), str):
        raise InvalidRequest(f"{where} must be a function tool with a name (or a namespace of them)", param=where)
    name = tool["name"] if space is None else joined(space, tool["name"])
    function = {"name": name, "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
    description = " ".join(d for d in (about, tool.get("description")) if isinstance(d, str) and d)
    if description:
        function["description"] = description
    return {"type": "function", "function": function}


def namespaced(tools: list[dict[str, Any]] | None) -> dict[str, tuple[str, str]]:
    """The model's name of each namespaced tool → (namespace, name), to write its calls back."""
    found = {}
    for tool in tools or ():
        if isinstance(tool, dict) and tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            for inner in tool["tools"]:
                if isinstance(inner, dict) and isinstance(inner.get("name"), str):
                    found[joined(tool["name"], inner["name"])] = (tool["name"], inner["name"])
    return found


def _choice(value: Any) -> Any:
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in HOSTED_TOOLS:  # a hosted tool is never in the prompt: nothing could be forced
        raise InvalidRequest(
            f"tool_choice forces the {kind} tool, which runs at the provider; this server does not run it",
            param="tool_choice",
        )
    if isinstance(value, dict) and kind not in (None, "function"):
        raise InvalidRequest(f"tool_choice type {kind!r} is not supported", param="tool_choice")
    return value
