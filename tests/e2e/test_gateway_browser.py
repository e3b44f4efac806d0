"""The gateway's web page in a real headless Chromium, against a real daemon, gateway and worker.

One test walks the page as a user would: the model picker lists the model, a chat answer
streams in and Stop cancels the generation on the worker, the playground shows the request as
curl and Escape stops a completion, the status tab lists the model, and a phone-width window
scrolls no sideways. Screenshots go to ``$VLLMMLXD_TEST_ARTIFACTS`` (default ``test-artifacts/``)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from tests.support.browser import artifacts_dir, chromium, chromium_or_skip, wait_until
from tests.support.daemon import free_port, make_daemon, model_entry, wait_gone
from vllmmlxd.config.keys import key_digest

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parent.parent.parent
MAX_TOKENS = 2000  # long enough to be still generating when Stop is pressed


def gateway_available() -> bool:
    from vllmmlxd.config.schema import Config

    return (REPO / "vllmmlxd/gateway/app.py").is_file() and "gateway" in Config.model_fields


@pytest.fixture
def gateway():
    """A daemon running ``tiny`` behind its gateway; yields (base URL, daemon, worker URL)."""
    chromium_or_skip()
    if not gateway_available():
        pytest.skip("this build has no gateway (vllmmlxd/gateway)")
    d = make_daemon()
    gport, mport = free_port(), free_port()
    d.write({"tiny": model_entry(mport, max_tokens=4096)}, gateway={"host": "127.0.0.1", "port": gport, "ui": True})
    d.start()
    try:
        d.wait_for(lambda ms: ms["tiny"]["state"] == "ready", timeout=180, what="tiny ready")
        base = f"http://127.0.0.1:{gport}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(base + "/", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"the gateway did not serve / in 60s:\n{d.log()[-3000:]}")
            time.sleep(0.2)
        yield base, d, f"http://127.0.0.1:{mport}"
    finally:
        pids = d.worker_pids() if d.proc and d.proc.poll() is None else []
        d.stop()
        assert wait_gone(pids)


def test_chat_playground_and_status_in_chromium(gateway):
    base, daemon, worker = gateway

    def running() -> int | None:
        return daemon.models()["tiny"].get("running")

    def completion_tokens() -> int:
        return httpx.get(worker + "/v1/status", timeout=10).json()["total_completion_tokens"]

    with chromium() as driver:
        walk_the_page(driver, base, running, completion_tokens)


def walk_the_page(driver, base: str, running, completion_tokens) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    shots = artifacts_dir()
    js = driver.execute_script
    driver.get(base + "/")

    # The picker lists the model, with its state.
    wait_until(
        driver,
        lambda d: any(o.get_attribute("value") == "tiny" for o in d.find_elements(By.CSS_SELECTOR, "#model option")),
        what="tiny in the model picker",
    )
    Select(driver.find_element(By.ID, "model")).select_by_value("tiny")
    assert "ready" in driver.find_element(By.CSS_SELECTOR, "#model option[value='tiny']").text

    # The renderer escapes HTML and keeps only http(s) links.
    rendered = js(
        "return Markdown.render(arguments[0])",
        "<img src=x onerror=alert(1)> **b** [x](javascript:alert(1)) [y](https://e.org)\n```\n<b>\n```",
    )
    assert "<img" not in rendered and "<b>\n" not in rendered and 'href="javascript' not in rendered
    assert "&lt;img" in rendered and "<strong>b</strong>" in rendered and 'href="https://e.org"' in rendered

    # Chat: Enter sends; the answer streams in (its text grows), Stop cancels it on the worker.
    max_tokens = driver.find_element(By.ID, "max-tokens")
    max_tokens.clear()
    max_tokens.send_keys(str(MAX_TOKENS))
    # Seeded: unseeded random weights sometimes end the answer in a few tokens, before it can be
    # seen growing or stopped; with this seed tiny's answer runs to max_tokens.
    driver.find_element(By.ID, "seed").send_keys("1")
    before = completion_tokens()
    box = driver.find_element(By.ID, "chat-input")
    box.send_keys("Tell me a long story.")
    box.send_keys(Keys.ENTER)
    wait_until(driver, lambda d: d.find_elements(By.CSS_SELECTOR, ".msg.user"), what="the user's message")
    body = "return (document.querySelector('.msg.assistant .body') || {}).textContent || ''"
    lengths: set[int] = set()

    def grown(d: object) -> bool:
        lengths.add(len(js(body)))
        return len(lengths - {0}) >= 2

    wait_until(driver, grown, what="two lengths of a growing answer")
    assert js("return document.querySelector('.msg.user .body').textContent") == "Tell me a long story."
    assert wait_until(driver, lambda d: (running() or 0) >= 1, timeout=10, what="the request running on the worker")
    driver.find_element(By.ID, "chat-stop").click()
    wait_until(
        driver,
        lambda d: js("return document.querySelector('.msg.assistant').dataset.done") == "stopped",
        what="the answer marked stopped",
    )
    wait_until(driver, lambda d: running() == 0, timeout=15, what="no request running after Stop")
    shown = len(js(body))
    time.sleep(0.5)
    assert len(js(body)) == shown, "the answer still grows after Stop"
    generated = completion_tokens() - before
    assert 0 < generated < MAX_TOKENS, f"the worker generated {generated} tokens: Stop did not cancel it"
    meta = driver.find_element(By.CSS_SELECTOR, ".msg.assistant .meta").text
    assert "first token" in meta and "stopped" in meta, meta
    assert driver.find_element(By.ID, "chat-send").is_enabled()
    driver.save_screenshot(str(shots / "gateway-chat-desktop.png"))

    # Playground: the request as curl and Python; Escape stops a completion.
    driver.find_element(By.ID, "tab-playground").click()
    curl = driver.find_element(By.ID, "pg-curl").text
    assert base + "/v1/completions" in curl and '"model": "tiny"' in curl, curl
    assert 'base_url="' + base + '/v1"' in driver.find_element(By.ID, "pg-python").text
    driver.find_element(By.ID, "pg-run").click()
    wait_until(driver, lambda d: d.find_element(By.ID, "pg-output").text.strip(), what="completion text")
    driver.find_element(By.ID, "pg-prompt").send_keys(Keys.ESCAPE)
    wait_until(driver, lambda d: "stopped" in d.find_element(By.ID, "pg-meta").text, what="the completion stopped")
    wait_until(driver, lambda d: running() == 0, timeout=15, what="no request running after Escape")

    # Status: a row for tiny, ready.
    driver.find_element(By.ID, "tab-status").click()
    row = wait_until(
        driver,
        lambda d: d.find_elements(By.CSS_SELECTOR, "#status-table tr[data-model='tiny']"),
        what="tiny's row in the status table",
    )[0]
    wait_until(driver, lambda d: "ready" in row.text, timeout=10, what="tiny ready in the status table")
    info = driver.find_element(By.ID, "daemon-info").text
    assert info.startswith("daemon · up ") and "gateway ready" in info and "config" not in info, info

    # A phone: one column, nothing scrolls sideways, on every tab.
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride", {"width": 375, "height": 800, "deviceScaleFactor": 1, "mobile": True}
    )
    for tab in ("status", "playground", "chat"):
        driver.find_element(By.ID, "tab-" + tab).click()
        time.sleep(0.2)
        width = js("return document.documentElement.scrollWidth")
        assert width <= 375, f"{tab}: the page is {width}px wide at 375px"
        driver.save_screenshot(str(shots / f"gateway-phone-{tab}.png"))


def test_the_page_asks_for_a_key_when_every_model_needs_one():
    """A gateway whose every model is keyed (started by hand: /api/models needs no worker): the page
    says a key is needed and opens Settings, and the key typed there brings the models in."""
    chromium_or_skip()
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    from tests.support.gateway import Gateway

    key = "sk-page-k3y"
    port = free_port()
    grants = [{"name": "alice", "sha256": key_digest(key), "allowed": True}]
    gw = Gateway(
        {
            "gateway": {"host": "127.0.0.1", "port": port},
            "routes": [
                {
                    "name": "locked",
                    "served_model_name": "locked-1",
                    "url": f"http://127.0.0.1:{free_port()}",
                    "state": "ready",
                    "api_keys": ["alice"],
                    "key_grants": grants,
                }
            ],
        },
        port,
    )
    try:
        with chromium() as driver:
            driver.get(gw.url + "/")
            # Found again at each poll: the page may replace it while it loads the models.
            notice = lambda d: d.find_element(By.ID, "notice")  # noqa: E731
            wait_until(
                driver,
                lambda d: notice(d).is_displayed() and "needs an API key" in notice(d).text,
                what="the notice that a key is needed",
            )
            assert driver.find_element(By.ID, "settings").get_attribute("open") is not None
            picker = lambda d: [o.text for o in d.find_elements(By.CSS_SELECTOR, "#model option")]  # noqa: E731
            wait_until(driver, lambda d: picker(d) == ["API key needed"], what="the picker saying a key is needed")
            driver.save_screenshot(str(artifacts_dir() / "gateway-key-needed.png"))
            box = driver.find_element(By.ID, "api-key")
            box.send_keys(key)
            box.send_keys(Keys.TAB)  # the change event
            wait_until(driver, lambda d: any("locked" in t for t in picker(d)), what="the keyed model in the picker")
            assert not notice(driver).is_displayed()
    finally:
        gw.proc.terminate()
        assert gw.wait() == 0, gw.log()[-3000:]
