"""The demo page in a real browser (Debian's chromium, headless, driven by
Playwright), through a proxy of the test's own that cuts connections at
random: from ``window.duplexStats``, resumes > 0, no gap, no duplicate, every
input answered once; a reload mid-stream resumes the same session.

Skipped where chromium or Playwright is absent, unless
``DUPLEX_REQUIRE_BROWSER=1`` (.ci/run installs both and sets it). The browser
is never downloaded: Playwright launches /usr/bin/chromium.
"""

from __future__ import annotations

import contextlib
import os
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal

from tests.client_support import CuttingProxy, cutting_proxy, serve_process

CHROMIUM = Path("/usr/bin/chromium")
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
INPUTS = 8
WAIT_MS = 30_000


def _browser_missing() -> str | None:
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is not installed (apt-get install chromium)"
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "playwright is not installed (pip install playwright)"
    return None


@pytest.fixture
def chromium() -> Iterator[Any]:
    missing = _browser_missing()
    if missing is not None:
        if os.environ.get("DUPLEX_REQUIRE_BROWSER") == "1":
            pytest.fail(f"DUPLEX_REQUIRE_BROWSER=1 but {missing}")
        pytest.skip(missing)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def _served_through_proxy() -> Iterator[tuple[BlockingPortal, CuttingProxy]]:
    """``serve --demo-page`` and a cutting proxy before it, on a loop in a thread
    (Playwright's sync API keeps this test's own thread)."""
    with start_blocking_portal(backend="trio") as portal:
        server = portal.wrap_async_context_manager(
            serve_process("--demo-page", "--event-rate", "20")
        )
        with server as (port, _), portal.wrap_async_context_manager(cutting_proxy(port)) as proxy:
            yield portal, proxy


def _stats(page: Any) -> dict[str, Any]:
    stats: dict[str, Any] = page.evaluate("() => ({...window.duplexStats})")
    return stats


def test_the_page_resumes_through_random_cuts_and_a_reload(chromium: Any) -> None:
    with _served_through_proxy() as (portal, proxy):
        page = chromium.new_page()
        page.goto(f"http://127.0.0.1:{proxy.port}/")
        page.wait_for_function("() => window.duplexStats?.state === 'open'", timeout=WAIT_MS)
        session_id = _stats(page)["session_id"]
        assert session_id.startswith("sess_")

        cutter = portal.start_task_soon(proxy.cut_at_random, random.Random(5), 0.6)  # noqa: S311
        try:
            for n in range(INPUTS):
                page.evaluate("(text) => window.duplexAsk(text)", f"question {n}")
                page.wait_for_timeout(150)
            page.click("#cut")  # the page's own button, too
            page.wait_for_function(
                f"() => window.duplexStats.inputs_answered === {INPUTS}"
                " && window.duplexStats.resumes > 0",
                timeout=WAIT_MS,
            )
        finally:
            cutter.cancel()
        page.wait_for_function("() => window.duplexStats.state === 'open'", timeout=WAIT_MS)
        page.wait_for_timeout(500)  # a late duplicate would show here
        stats = _stats(page)
        if os.environ.get("DUPLEX_BROWSER_SCREENSHOT"):
            page.screenshot(path=os.environ["DUPLEX_BROWSER_SCREENSHOT"])
        assert proxy.cuts > 0
        assert stats["resumes"] > 0, stats
        assert (stats["gaps"], stats["duplicates"]) == (0, 0), stats
        assert stats["inputs_sent"] == stats["inputs_answered"] == INPUTS, stats
        assert stats["session_id"] == session_id

        # A reload mid-stream: the new page resumes the same session from storage.
        events_before = stats["events"]
        assert events_before > 0
        page.reload()
        page.wait_for_function(
            "() => window.duplexStats?.state === 'open' && window.duplexStats.events > 3",
            timeout=WAIT_MS,
        )
        again = _stats(page)
        assert again["session_id"] == session_id
        assert again["reloaded"] is True
        assert again["resumes"] == 1
        assert (again["gaps"], again["duplicates"]) == (0, 0), again
        page.close()
