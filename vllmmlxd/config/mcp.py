"""The ``mcp_servers`` section: how a worker reaches each MCP server, and the import of a
Claude-Desktop-style ``mcpServers`` file."""

from __future__ import annotations

import fnmatch
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, SecretStr, field_validator, model_validator

from .base import Strict as _Strict
from .fields import Names

# MCP server names prefix their tools as SERVER__TOOL, so a name never holds "__" itself, and
# stays inside the tool-name alphabet the OpenAI and Anthropic APIs accept.
MCP_SERVER_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]|_(?!_)){0,31}$")
MCP_TOOL_SEPARATOR = "__"


class McpServerConfig(_Strict):
    """One MCP server a worker connects to: a child process over stdio, or a URL.

    ``env`` and ``headers`` values are secrets (tokens): kept as SecretStr, so they are never
    printed, and revealed only on a worker's stdin (``ModelConfig.to_worker_json``).
    """

    transport: Literal["stdio", "streamable-http", "sse"] = "stdio"
    command: str | None = Field(None, description="stdio: the program to run")
    args: Names = ()
    env: dict[str, SecretStr] = Field(
        default_factory=dict, description="stdio: variables added to a small safe environment"
    )
    cwd: str | None = None
    url: str | None = Field(None, description="streamable-http or sse: the server's endpoint")
    headers: dict[str, SecretStr] = Field(default_factory=dict, description="HTTP headers sent with every request")
    timeout: float = Field(30.0, gt=0, le=3600, description="seconds one tool execution (and connecting) may take")
    allow_tools: Names = Field(("*",), description="tool names (shell patterns) offered; default all")
    deny_tools: Names = Field((), description="tool names (shell patterns) never offered, even if allowed")
    enabled: bool = True

    @model_validator(mode="before")
    @classmethod
    def _infer_transport(cls, data: Any) -> Any:
        # A server written like a Claude Desktop one ({command} or {url}) needs no transport key.
        if isinstance(data, dict) and "transport" not in data and data.get("url") and not data.get("command"):
            data = {**data, "transport": "streamable-http"}
        return data

    @field_validator("env", "headers", mode="before")
    @classmethod
    def _text_values(cls, v: Any) -> Any:
        # Numbers in YAML (PORT: 8080) are meant as text in an environment or a header.
        if isinstance(v, dict):
            return {k: str(x) if isinstance(x, (int, float)) and not isinstance(x, bool) else x for k, x in v.items()}
        return v

    @model_validator(mode="after")
    def _fits_transport(self) -> McpServerConfig:
        if self.transport == "stdio":
            if not self.command:
                raise ValueError("a stdio MCP server needs command")
            if self.url or self.headers:
                raise ValueError("url and headers are for streamable-http and sse servers, not stdio")
        else:
            if not self.url or not self.url.startswith(("http://", "https://")):
                raise ValueError(f"a {self.transport} MCP server needs url: http://... or https://...")
            if self.command or self.args or self.env or self.cwd:
                raise ValueError(f"command, args, env and cwd are for stdio servers, not {self.transport}")
        return self

    def offers(self, tool: str) -> bool:
        """Whether this server's tool ``tool`` passes its allow_tools / deny_tools patterns."""
        return any(fnmatch.fnmatchcase(tool, p) for p in self.allow_tools) and not any(
            fnmatch.fnmatchcase(tool, p) for p in self.deny_tools
        )

    def revealed(self) -> dict[str, Any]:
        """This server as plain JSON, secrets shown: for a worker's stdin only."""
        data = self.model_dump(mode="json")
        data["env"] = {k: v.get_secret_value() for k, v in self.env.items()}
        data["headers"] = {k: v.get_secret_value() for k, v in self.headers.items()}
        return data


def check_mcp_server_names(names: Iterable[str]) -> None:
    """Raise ``ValueError`` for the first name that cannot prefix its tools' names."""
    for name in names:
        if not MCP_SERVER_NAME_RE.match(name):
            raise ValueError(
                f"MCP server name {name!r} must be letters, digits, '-' or single '_' (at most 32; "
                f"'__' separates server and tool)"
            )


def load_mcp_file(path: str | Path) -> dict[str, McpServerConfig]:
    """The servers of a Claude-Desktop-style ``{"mcpServers": {...}}`` file, taken as they are.

    Keys those files carry for other tools (``autoApprove``, ``alwaysAllow``...) are ignored;
    ``type`` is read as the transport and ``disabled: true`` as ``enabled: false``. Errors name
    the server, never a value (env and headers hold tokens), nor the file's path: it is a value too,
    and the error's position (the ``mcp_config`` key, or the flag) says which file.
    """
    from pydantic import ValidationError

    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ValueError(f"cannot read the MCP config file: {e.strerror or type(e).__name__}") from None
    except ValueError as e:  # JSON syntax (its message gives the position, not the text) or not UTF-8
        raise ValueError(f"the MCP config file is not JSON: {str(e).split(':')[0]}") from None
    servers = data.get("mcpServers") if isinstance(data, dict) else None
    if not isinstance(servers, dict):
        raise ValueError('the MCP config file has no "mcpServers" object')
    check_mcp_server_names(servers)
    out: dict[str, McpServerConfig] = {}
    kinds = {
        "stdio": "stdio",
        "sse": "sse",
        "http": "streamable-http",
        "streamable-http": "streamable-http",
        "streamableHttp": "streamable-http",
    }
    for name, spec in servers.items():
        if not isinstance(spec, dict):
            raise ValueError(f"MCP config: server {name!r} is not an object")
        fields = {
            k: spec[k]
            for k in ("command", "args", "env", "cwd", "url", "headers", "timeout")
            if spec.get(k) is not None
        }
        kind = spec.get("transport", spec.get("type"))
        if kind is not None:
            if kind not in kinds:
                raise ValueError(
                    f"MCP config: server {name!r} has an unknown type (stdio, sse, http or streamable-http)"
                )
            fields["transport"] = kinds[kind]
        if spec.get("disabled") is True:
            fields["enabled"] = False
        try:
            out[name] = McpServerConfig.model_validate(fields)
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'server'}: {e['msg'].removeprefix('Value error, ')}"
                for e in exc.errors(include_input=False, include_url=False)
            )
            raise ValueError(f"MCP config: server {name!r}: {problems}") from None
    return out


def _whole_servers(patterns: tuple[str, ...]) -> tuple[str, ...]:
    # A bare server name means all of its tools (those its allow_tools / deny_tools let through):
    # written as SERVER__* here, so the worker matches one form of pattern.
    return tuple(p if MCP_TOOL_SEPARATOR in p or p == "*" else p + MCP_TOOL_SEPARATOR + "*" for p in patterns)


# Tools as SERVER__TOOL shell patterns, or a server's name for all its tools.
ToolPatterns = Annotated[Names, AfterValidator(_whole_servers)]


class McpEntryConfig(_Strict):
    """A model entry's MCP tools: the servers its worker connects to, and the tools it runs itself."""

    mcp: Names = Field((), description="names from mcp_servers whose tools this model's worker offers")
    mcp_auto_execute: ToolPatterns = Field(
        (),
        description="tools the worker runs itself: SERVER__TOOL (shell patterns), or a server's name for all its tools",
    )
    mcp_max_tool_calls: int = Field(8, ge=0, le=1000, description="tool executions one request may make at most")
    mcp_config: str | None = Field(None, description="a Claude-Desktop-style mcpServers JSON file: all its servers")
