"""Agents that speak the Responses API, against a real worker: OpenAI's Agents SDK (a run and a
streamed run, with a function tool called and its result sent back), and OpenAI's Codex CLI (npm
``@openai/codex``, the version the Makefile pins), as its documentation configures a custom model
provider: ``wire_api = "responses"`` and its key from an environment variable, nothing else. It
sends its hosted ``web_search`` tool, which the worker leaves out (and refuses by name on an entry
with ``hosted_tools: refuse``).

What Codex 0.171.0 sends on each turn: ``stream: true``, ``store: false``, ``include:
["reasoning.encrypted_content"]``, ``reasoning: {summary: auto}``, ``tool_choice: auto`` with
``parallel_tool_calls``, function tools and a ``namespace`` of them (its sub-agent tools), the
conversation as ``developer`` and ``user`` message items carrying their own ids (a ~9k-token
system prompt), and ``prompt_cache_key`` / ``client_metadata``; a resumed session sends the whole
conversation again, earlier answers included, with no ``previous_response_id``. It treats a
response cut by the token limit as an error, so the worker serves a random-weight model with a
32k context that answers "Hello" and ends its turn by construction (tests/support/models.py).
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
from pathlib import Path
from typing import Annotated

import agents  # openai-agents, from the dev extra
import openai
import pytest
from pydantic import Field

from tests.support.models import ANSWER, answering_tiny
from tests.support.servers import start_serve

REPO = Path(__file__).parents[2]
_PINNED = re.search(r"^CODEX_VERSION = (\S+)", (REPO / "Makefile").read_text(), re.M)
assert _PINNED is not None, "the Makefile pins CODEX_VERSION"
CODEX_VERSION = _PINNED.group(1)
CODEX = REPO / ".clients" / f"codex-{CODEX_VERSION}" / "node_modules" / ".bin" / "codex"
KEY = "codex-k3y-0001"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    model = answering_tiny(Path(os.environ["VLLMMLXD_STATE_DIR"]) / "test-models" / "answering-tiny-32k")
    keyfile = tmp_path_factory.mktemp("key") / "key"
    keyfile.write_text(KEY)
    s = start_serve(str(model), "--served-model-name", "tiny-long", "--api-key-file", str(keyfile), "--timeout", "120")
    yield s
    assert s.stop() == 0, s.log()[-3000:]
    assert KEY not in s.log()


def served(log: str) -> list[dict[str, str]]:
    """The worker's request.served lines for /v1/responses, as fields."""
    lines = [line for line in log.splitlines() if "event=request.served" in line and "route=/v1/responses" in line]
    return [dict(re.findall(r"(\w+)=(\S+)", line)) for line in lines]


def codex(home: Path, work: Path, *args: str) -> tuple[subprocess.CompletedProcess, str]:
    """One ``codex exec`` run; its output and the last message it wrote to a file."""
    if not CODEX.exists():
        pytest.fail(f"{CODEX} is missing: `make test` (or `make clients`) installs Codex {CODEX_VERSION}")
    last = home / "last-message.txt"
    last.unlink(missing_ok=True)
    run = subprocess.run(
        [str(CODEX), "exec", "--skip-git-repo-check", "--sandbox", "read-only", "-o", str(last), *args],
        cwd=work,
        env={**os.environ, "CODEX_HOME": str(home), "HOME": str(home), "VLLMMLXD_TEST_KEY": KEY, "NO_COLOR": "1"},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=240,
    )
    return run, last.read_text() if last.exists() else ""


def configured(tmp_path: Path, url: str) -> tuple[Path, Path]:
    """A Codex home whose config.toml names the worker as its documentation shows a custom provider."""
    home, work = tmp_path / "codex-home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    (home / "config.toml").write_text(
        f"""model = "tiny-long"
model_provider = "vllmmlxd"

[model_providers.vllmmlxd]
name = "vllmmlxd"
base_url = "{url}/v1"
wire_api = "responses"
env_key = "VLLMMLXD_TEST_KEY"
"""
    )
    return home, work


def test_codex_exec_runs_a_turn_and_a_resumed_one_against_the_worker(worker, tmp_path):
    home, work = configured(tmp_path, worker.url)
    version = subprocess.run([str(CODEX), "--version"], capture_output=True, text=True, check=True).stdout
    assert CODEX_VERSION in version
    run, last = codex(home, work, "Say hello")
    output = run.stdout + run.stderr
    assert run.returncode == 0 and "ERROR" not in output, output[-3000:]
    assert last.strip() == ANSWER
    [first] = served(worker.log())
    assert first["status"] == "200" and int(first["prompt_tokens"]) > 4000  # the long system prompt
    assert "event=request.tools_ignored" in worker.log() and "tools=web_search" in worker.log()  # Codex sent it

    # A resumed session replays the conversation: the prefix cache serves the first turn's tokens.
    run, last = codex(home, work, "resume", "--last", "Say it again")
    output = run.stdout + run.stderr
    assert run.returncode == 0 and "ERROR" not in output, output[-3000:]
    assert last.strip() == ANSWER
    second = served(worker.log())[1]
    assert second["status"] == "200" and int(second["prompt_tokens"]) > int(first["prompt_tokens"])
    assert int(second["cached_tokens"]) >= int(first["prompt_tokens"]) - 16


def test_codex_exec_meets_the_documented_400_where_hosted_tools_are_refused(tmp_path):
    model = answering_tiny(Path(os.environ["VLLMMLXD_STATE_DIR"]) / "test-models" / "answering-tiny-32k")
    keyfile = tmp_path / "key"
    keyfile.write_text(KEY)
    s = start_serve(
        str(model), "--served-model-name", "tiny-long", "--api-key-file", str(keyfile), "--hosted-tools", "refuse"
    )
    try:
        home, work = configured(tmp_path, s.url)
        run, last = codex(home, work, "Say hello")
        assert run.returncode != 0 and not last.strip()
        assert "web_search tool runs at the provider" in run.stdout + run.stderr, (run.stdout + run.stderr)[-3000:]
        [refused] = served(s.log())
        assert refused["status"] == "400"
    finally:
        assert s.stop() == 0, s.log()[-3000:]


def test_the_agents_sdk_runs_an_agent_with_a_tool_streamed_and_not(worker):
    agents.set_tracing_disabled(True)  # its traces would go to OpenAI
    asked: list[str] = []

    # The schema bounds the argument: even random weights must close the string (the grammar).
    @agents.function_tool
    def get_weather(city: Annotated[str, Field(max_length=8)]) -> str:
        """The weather in a city."""
        asked.append(city)
        return "sunny"

    async def runs() -> tuple[object, object]:
        client = openai.AsyncOpenAI(base_url=worker.url + "/v1", api_key=KEY, max_retries=0, timeout=120)
        agent = agents.Agent(
            name="helper",
            instructions="Be brief.",
            model=agents.OpenAIResponsesModel(model="tiny-long", openai_client=client),
            tools=[get_weather],
            # Forced on the first turn; the SDK sets it back to auto once the tool has run.
            model_settings=agents.ModelSettings(tool_choice="required", max_tokens=64),
        )
        whole = await agents.Runner.run(agent, "Weather in Paris?", max_turns=4)
        streamed = agents.Runner.run_streamed(agent, "Weather in Paris?", max_turns=4)
        kinds = {event.type async for event in streamed.stream_events()}
        assert "raw_response_event" in kinds
        return whole, streamed

    whole, streamed = asyncio.run(runs())
    # Each run: the forced call, its output sent back as function_call_output, then the answer.
    kinds = [type(item).__name__ for item in whole.new_items]
    assert kinds == ["ToolCallItem", "ToolCallOutputItem", "MessageOutputItem"], kinds
    assert whole.final_output == streamed.final_output == ANSWER
    assert len(asked) == 2 and all(len(city) <= 8 for city in asked)
