"""A headless Chromium driven by Selenium, from Debian's ``chromium`` and ``chromium-driver``.

``make system-deps`` installs them where apt-get and root are at hand; elsewhere
``chromium_or_skip`` gives the reason a test skips."""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent.parent
_BROWSERS = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "chromium", "chromium-browser", "google-chrome")
_DRIVERS = ("/usr/bin/chromedriver", "chromedriver")
OPTIONS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
)


def _which(candidates) -> str | None:
    for name in candidates:
        found = shutil.which(name)
        if found:
            return found
    return None


def chromium_or_skip() -> tuple[str, str]:
    """The browser and driver binaries, or skip the test saying what is missing."""
    try:
        import selenium  # noqa: F401
    except ImportError:
        pytest.skip("selenium is not installed (pip install -e '.[dev]')")
    browser, driver = _which(_BROWSERS), _which(_DRIVERS)
    if not browser or not driver:
        missing = " and ".join(n for n, p in (("chromium", browser), ("chromedriver", driver)) if not p)
        pytest.skip(f"{missing} not found (Debian: `make system-deps`, or apt-get install chromium chromium-driver)")
    return browser, driver


def artifacts_dir() -> Path:
    path = Path(os.environ.get("VLLMMLXD_TEST_ARTIFACTS", REPO / "test-artifacts"))
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def chromium(width: int = 1280, height: int = 900):
    """A fresh headless Chromium (its own profile in a temporary folder), quit on exit."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver_path = chromium_or_skip()
    profile = tempfile.mkdtemp(prefix="vd-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in (*OPTIONS, f"--user-data-dir={profile}", f"--window-size={width},{height}"):
        options.add_argument(arg)
    service = Service(executable_path=driver_path, log_output=os.devnull)
    driver = webdriver.Chrome(service=service, options=options)
    try:
        driver.set_window_size(width, height)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_until(driver, predicate, timeout: float = 20, what: str = "condition"):
    """Poll ``predicate(driver)`` until it returns something truthy; returns it. On time out, the
    assertion shows what the page says (its visible text) to tell why."""
    from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        # An element the page replaced between two polls is read again at the next one.
        wait = WebDriverWait(driver, timeout, poll_frequency=0.05, ignored_exceptions=(StaleElementReferenceException,))
        return wait.until(predicate)
    except TimeoutException:
        shown = driver.execute_script("return document.body ? document.body.innerText : ''")
        raise AssertionError(f"{what} not seen in {timeout}s; the page shows:\n{shown[-2000:]}") from None


__all__ = ["OPTIONS", "artifacts_dir", "chromium", "chromium_or_skip", "wait_until"]
