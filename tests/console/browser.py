"""Debian's Chromium driven by Playwright for Python, for the console's end-to-end tests.

Playwright launches the system browser (`make install` puts it at /usr/bin/chromium);
it never downloads a browser of its own. The flags keep a headless Chromium from
reaching out to the network or needing a GPU or a sandbox in a container.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from playwright.sync_api import Browser, sync_playwright

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@contextmanager
def chromium() -> Iterator[Browser]:
    assert CHROMIUM.exists(), "no /usr/bin/chromium: run `make install` (apt package chromium)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=FLAGS,
                                             timeout=60_000)
        try:
            yield browser
        finally:
            browser.close()
