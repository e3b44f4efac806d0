"""DeepSeek calls (V3, R1, V3.1): ``tool_call_parser: deepseek``.

A section of one or more calls; V3 and R1 write each call's type, name and fenced JSON::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>

V3.1 writes the name and the bare JSON::

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

(the bars are U+FF5C, the blanks U+2581). Every marker is a special token. A call written
without its section (``<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>`` alone) is read too.
``render_call`` and ``grammar`` write the V3 / R1 form.
"""

from __future__ import annotations

import json
import re

from vllmmlxd.parsers.grammar import json_rule
from vllmmlxd.parsers.tools.base import MalformedCall, ToolCall, ToolParser, arguments_text, per_tool_rules

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"
# V3 / R1: after "function<sep>", the name on its line, then the JSON in a ```json fence.
_FENCED = re.compile(r"\s*([^\s`]+)\s*\n\s*```(?:json)?\s*\n(.*)```\s*", re.DOTALL)


class DeepSeekToolParser(ToolParser):
    name = "deepseek"
    starts = (CALLS_BEGIN, CALL_BEGIN)
    markers = frozenset({CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP})

    def _end(self) -> str:
        return CALLS_END if self.opened == CALLS_BEGIN else CALL_END

    def call_end(self, buf: str) -> int | None:
        cut = buf.find(self._end())
        return None if cut < 0 else cut + len(self._end())

    def body_of(self, call_text: str) -> str:
        return call_text.removesuffix(self._end())

    def parse_calls(self, body: str) -> list[ToolCall]:
        if self.opened == CALL_BEGIN:
            return [_one_call(body)]
        first, *calls = body.split(CALL_BEGIN)
        if first.strip():
            raise MalformedCall("a section holds calls only")
        out = []
        for i, part in enumerate(calls):
            text, closed, rest = part.partition(CALL_END)
            # Only the last call may lack its end (generation stopped right after its JSON).
            if rest.strip() or (not closed and i < len(calls) - 1):
                raise MalformedCall("a call is <｜tool▁call▁begin｜>...<｜tool▁call▁end｜>")
            out.append(_one_call(text))
        return out

    @classmethod
    def render_call(cls, name: str, arguments: dict) -> str:
        return CALLS_BEGIN + _render_one(name, arguments) + CALLS_END

    @classmethod
    def grammar(cls, tools: list[dict], *, parallel: bool = True) -> str:
        # The markers are special tokens; written here as their text, which matches where
        # llguidance's tokenizer maps that text to the token (and as plain text in tests).
        def rule(name: str, schema: dict) -> str:
            head = json.dumps(name + "\n```json\n", ensure_ascii=False)
            return f"{head} {json_rule(schema)}"

        calls, rules = per_tool_rules(tools, rule)
        lines = [
            f'start: "{CALLS_BEGIN}" call{"+" if parallel else ""} "{CALLS_END}"',
            f'call: "{CALL_BEGIN}function{SEP}" {calls} "\\n```{CALL_END}"',
            *rules,
        ]
        return "\n".join(lines)


def _render_one(name: str, arguments: dict) -> str:
    return f"{CALL_BEGIN}function{SEP}{name}\n```json\n{json.dumps(arguments, ensure_ascii=False)}\n```{CALL_END}"


def _one_call(text: str) -> ToolCall:
    head, sep, rest = text.partition(SEP)
    if not sep:
        raise MalformedCall("a call is NAME<｜tool▁sep｜>ARGUMENTS")
    fenced = _FENCED.fullmatch(rest) if head.strip() == "function" else None
    if fenced:
        return ToolCall(fenced.group(1), arguments_text(json.loads(fenced.group(2))))
    name = head.strip()
    if not name or any(c.isspace() for c in name):
        raise MalformedCall("a tool's name is one word")
    return ToolCall(name, arguments_text(json.loads(rest)))


Parser = DeepSeekToolParser
