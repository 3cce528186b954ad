"""Chromium through Playwright, with Debian's chromium."""

import json
from pathlib import Path

from tests.support.browsers.driver import (
    COMMAND_TIMEOUT_S,
    START_TIMEOUT_S,
    Driver,
    json_wrapped,
)

CHROMIUM = "/usr/bin/chromium"


class ChromiumDriver(Driver):
    """Chromium through Playwright. Beyond :class:`Driver`, what only this one is asked for:
    screenshots, downloads, and a second person's page in the same browser."""

    engine = "chromium"

    def __init__(
        self,
        width: int = 1280,
        height: int = 900,
        *,
        locale: str | None = None,
        timezone_id: str | None = None,
        _browser=None,
    ):
        self._playwright = None
        if _browser is None:
            from playwright.sync_api import sync_playwright

            self._playwright = sync_playwright().start()
        try:
            self._browser = _browser or self._playwright.chromium.launch(
                executable_path=CHROMIUM,
                args=["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"],
                timeout=START_TIMEOUT_S * 1000,
            )
            self._context = self._browser.new_context(
                viewport={"width": width, "height": height},
                accept_downloads=True,
                locale=locale,
                timezone_id=timezone_id,
            )
            self._page = self._context.new_page()
        except Exception:
            if self._playwright is not None:
                self._playwright.stop()
            raise
        self._page.set_default_timeout(COMMAND_TIMEOUT_S * 1000)
        self._errors: list[str] = []
        self._page.on("pageerror", lambda error: self._errors.append(str(error)))
        self._page.on(
            "console", lambda m: self._errors.append(m.text) if m.type == "error" else None
        )

    def another_person(
        self,
        width: int = 1280,
        height: int = 900,
        *,
        locale: str | None = None,
        timezone_id: str | None = None,
    ) -> "ChromiumDriver":
        """A page with cookies of its own (a new browser context) in the same browser, for a
        second person, in ``locale`` and ``timezone_id`` if given (a person elsewhere); its
        ``close()`` closes that context only."""
        return ChromiumDriver(
            width, height, locale=locale, timezone_id=timezone_id, _browser=self._browser
        )

    def goto(self, url):
        self._errors.clear()
        self._page.goto(url)

    def evaluate(self, expression):
        return json.loads(self._page.evaluate(json_wrapped(expression)))

    def type_into(self, selector, text):
        field = self._page.locator(selector)
        field.fill("")
        field.press_sequentially(text)

    def click(self, selector):
        self._page.click(selector)

    def select(self, selector, value):
        self._page.select_option(selector, value)

    def set_viewport(self, width, height):
        self._page.set_viewport_size({"width": width, "height": height})

    def console_errors(self):
        return list(self._errors)

    def clear_console_errors(self) -> None:
        """Forget the errors so far: a test that made the page fail on purpose, and checked them,
        leaves the page to the next test without them."""
        self._errors.clear()

    def screenshot(self, path: Path) -> None:
        """Save the whole page, not only the viewport, as a PNG at ``path``."""
        self._page.screenshot(path=str(path), full_page=True)

    def download(self, selector: str) -> Path:
        """Click ``selector`` and wait for the download it starts; the downloaded file."""
        with self._page.expect_download() as download:
            self._page.click(selector)
        return Path(download.value.path())

    def close(self):
        try:
            self._context.close()
        finally:
            if self._playwright is not None:
                try:
                    self._browser.close()
                finally:
                    self._playwright.stop()
