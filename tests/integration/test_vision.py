"""A vision-language entry (builtin:tiny-vlm, through mlx-vlm) on a real worker: it says it takes
images, and serves text through the same batch as any model. (Images themselves: the next step
of docs/plans/vision.md.)"""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.support.servers import start_serve


@pytest.fixture(scope="module")
def server():
    s = start_serve("builtin:tiny-vlm", "--timeout", "60")
    yield s
    assert s.stop() == 0, s.log()[-3000:]


def test_the_entry_says_it_takes_images(server):
    [card] = httpx.get(server.url + "/v1/models").json()["data"]
    assert card["vision"] is True
    assert httpx.get(server.url + "/v1/status").json()["vision"] is True
    assert "vision=True" in server.log()


def test_text_is_served_by_its_decoder_streamed_and_not(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=60)
    kw = dict(model="m", messages=[{"role": "user", "content": "Describe a cat."}], max_tokens=8, temperature=0)
    whole = client.chat.completions.create(**kw)
    streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw))
    assert whole.choices[0].message.content and streamed == whole.choices[0].message.content
