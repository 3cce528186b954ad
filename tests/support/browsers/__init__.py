"""One small driver for the dashboard's browser tests, three engines behind it: Chromium through
Playwright, Firefox ESR over WebDriver BiDi (a websocket, aiohttp) and WebKitGTK, Safari's engine,
through WebKitWebDriver (classic WebDriver over HTTP, httpx) on an Xvfb display. All three use the
Debian packages (scripts/ensure-test-tools); none downloads a browser.

A driver holds one page. Scripts are JavaScript expressions; a promise is awaited and the value
comes back through JSON, so a Date reads as its ISO string in every engine. Every wait is bounded
and ``close()`` kills what was started, whatever state it is in.
"""

import os
from pathlib import Path

from tests.support.browsers.chromium import CHROMIUM, ChromiumDriver
from tests.support.browsers.driver import BrowserError, Driver
from tests.support.browsers.firefox import FIREFOX, FirefoxDriver
from tests.support.browsers.webkit import WEBKIT_DRIVER, XVFB, WebKitDriver

__all__ = ["BrowserError", "ChromiumDriver", "Driver", "FirefoxDriver", "WebKitDriver"]

ENGINES = ("chromium", "firefox", "webkit")
DRIVERS = {"chromium": ChromiumDriver, "firefox": FirefoxDriver, "webkit": WebKitDriver}
#: What each engine needs, and the Debian package that has it.
NEEDS = {
    "chromium": {CHROMIUM: "chromium"},
    "firefox": {FIREFOX: "firefox-esr"},
    "webkit": {WEBKIT_DRIVER: "webkit2gtk-driver", XVFB: "xvfb"},
}


def selected_engines() -> list[str]:
    """The engines INTUNE_TEST_BROWSERS names (comma-separated), all three by default."""
    names = [n.strip() for n in os.getenv("INTUNE_TEST_BROWSERS", ",".join(ENGINES)).split(",")]
    names = [n for n in names if n]
    unknown = [n for n in names if n not in ENGINES]
    if unknown:
        raise ValueError(
            f"INTUNE_TEST_BROWSERS names {unknown}: it takes {', '.join(ENGINES)} (comma-separated)"
        )
    return names


def missing_for(engine: str) -> list[str]:
    """The Debian packages ``engine`` needs that this machine lacks."""
    return [package for path, package in NEEDS[engine].items() if not Path(path).exists()]


def launch(engine: str, width: int = 1280, height: int = 900) -> Driver:
    """A driver of ``engine`` with one page of ``width`` x ``height``."""
    return DRIVERS[engine](width, height)
