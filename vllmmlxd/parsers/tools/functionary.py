"""MeetKai Functionary v3 calls: ``tool_call_parser: functionary``. Both v3 formats, told apart by the marker.

v3.2 (functionary-small/medium-v3.2) writes segments, each a function's name, a newline and its
JSON arguments; ``all`` introduces plain text; the chat template's generation prompt already ends
in ``>>>``, so the answer's first segment comes without it::

    all
    Let me check.>>>get_weather
    {"city": "Paris"}>>>get_time
    {}

(``python`` may be followed by raw code instead of JSON, up to the next ``>>>``: ``{"code": ...}``.)

v3.1 (functionary-small-v3.1, on Llama 3.1) writes::

    <function=get_weather>{"city": "Paris"}</function>
"""

from __future__ import annotations

import json
import re
import string

from vllmmlxd.parsers.grammar import json_rule
from vllmmlxd.parsers.tools._jsoncalls import json_call_end
from vllmmlxd.parsers.tools.base import Piece, ToolCall, ToolParser, arguments_text, function_of

_NAME = re.compile(r"[\w.-]*")
_FUNCTION, _FUNCTION_END = "<function=", "</function>"


class FunctionaryToolParser(ToolParser):
    name = "functionary"
    starts = (">>>", _FUNCTION)
    # v3.2's first segment has its ">>>" in the prompt: a name may open the answer.
    bare_starts = string.ascii_letters + string.digits + "_"
    markers = frozenset()  # neither format uses special tokens

    def call_end(self, buf: str) -> int | None:
        match = _NAME.match(buf)
        assert match is not None  # the pattern matches the empty string
        name = match.end()
        if name == len(buf):
            return None
        if buf[name] != (">" if self.opened == _FUNCTION else "\n") or not name:
            return name  # not a call after all: the marker goes back as text
        if self.opened == _FUNCTION:
            return json_call_end(buf, _FUNCTION_END, name + 1)
        if buf[:name] == "all":
            return name + 1
        code = buf[name + 1 :].lstrip()
        if buf[:name] == "python" and code and code[0] != "{":  # raw code runs to the next segment
            cut = buf.find(">>>", name + 1)
            return None if cut < 0 else cut
        return json_call_end(buf, "", name + 1)

    def body_of(self, call_text: str) -> str:
        return call_text.removesuffix(_FUNCTION_END) if self.opened == _FUNCTION else call_text

    def parse_calls(self, body: str) -> list[ToolCall]:
        name, _, args = body.partition(">" if self.opened == _FUNCTION else "\n")
        if name == "python" and not args.lstrip().startswith("{"):
            return [ToolCall(name, arguments_text({"code": args}))]
        return [ToolCall(name, arguments_text(json.loads(args)))]

    def _close(self, out: list[Piece], call_text: str) -> None:
        if self.opened != _FUNCTION and call_text == "all\n":
            self._in_call = False  # ">>>all" only says plain text follows
            return
        super()._close(out, call_text)

    @classmethod
    def render_call(cls, name: str, arguments: dict) -> str:
        return f">>>{name}\n{json.dumps(arguments, ensure_ascii=False)}"  # v3.2, the current version

    @classmethod
    def grammar(cls, tools: list[dict], *, parallel: bool = True) -> str:
        # v3.2 (its first ">>>" optional: the prompt may hold it) or v3.1; arguments held to each schema.
        lines = [
            "start: v32 | v31",
            'v32: ">>>"? seg' + (' (ws ">>>" seg)*' if parallel else ""),
            "v31: func" + (" (ws func)*" if parallel else ""),
            "seg: " + " | ".join(f"seg{i}" for i in range(len(tools))),
            "func: " + " | ".join(f"func{i}" for i in range(len(tools))),
            "ws: /[ \\n]{0,2}/",
        ]
        for i, tool in enumerate(tools):
            fn = function_of(tool)
            lines += [
                f'seg{i}: {json.dumps(fn["name"])} "\\n" args{i}',
                f'func{i}: "<function=" {json.dumps(fn["name"])} ">" args{i} "</function>"',
                f"args{i}: {json_rule(fn.get('parameters') or {'type': 'object'})}",
            ]
        return "\n".join(lines)


Parser = FunctionaryToolParser
