"""One small driver for the dashboard's browser tests, three engines behind it: Chromium through
Playwright, Firefox ESR over WebDriver BiDi (a websocket, aiohttp) and WebKitGTK, Safari's engine,
through WebKitWebDriver (classic WebDriver over HTTP, httpx) on an Xvfb display. All three use the
Debian packages (scripts/ensure-test-tools); none downloads a browser.

A driver holds one page. Scripts are JavaScript expressions; a promise is awaited and the value
comes back through JSON, so a Date reads as its ISO string in every engine. Every wait is bounded
and ``close()`` kills what was started, whatever state it is in.
"""

import asyncio
import json
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from itertools import count
from pathlib import Path

import httpx

from tests.support.ports import free_port

ENGINES = ("chromium", "firefox", "webkit")
CHROMIUM = "/usr/bin/chromium"
FIREFOX = "/usr/bin/firefox-esr"
WEBKIT_DRIVER = "/usr/bin/WebKitWebDriver"
XVFB = "/usr/bin/Xvfb"
#: What each engine needs, and the Debian package that has it.
NEEDS = {
    "chromium": {CHROMIUM: "chromium"},
    "firefox": {FIREFOX: "firefox-esr"},
    "webkit": {WEBKIT_DRIVER: "webkit2gtk-driver", XVFB: "xvfb"},
}
START_TIMEOUT_S = 30
COMMAND_TIMEOUT_S = 30

# Collects what the page reports as an error (for the engine whose protocol has no log events):
# uncaught errors, rejected promises and console.error.
_ERROR_COLLECTOR = """(() => {
  if (window.__intuneErrors) return true;
  const errors = window.__intuneErrors = [];
  window.addEventListener("error", (e) => errors.push(String(e.message || e)));
  window.addEventListener("unhandledrejection", (e) => errors.push(`unhandled rejection: ${e.reason}`));
  const original = console.error;
  console.error = (...args) => { errors.push(args.map(String).join(" ")); original.apply(console, args); };
  return true;
})()"""


class BrowserError(RuntimeError):
    """The browser or its driver answered with an error, or not in time."""


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


def _json_wrapped(expression: str) -> str:
    """An expression whose value is JSON text of ``expression``'s (awaited) value."""
    return (
        "(async () => { const value = await (" + expression + ");"
        " return value === undefined ? 'null' : JSON.stringify(value); })()"
    )


class Driver:
    """What a test does with a page, the same in every engine."""

    engine = ""

    def goto(self, url: str) -> None:
        """Load ``url`` and wait for its load event."""
        raise NotImplementedError

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (a promise is awaited)."""
        raise NotImplementedError

    def type_into(self, selector: str, text: str) -> None:
        """Empty the field ``selector`` and type ``text`` into it as keystrokes, as a person does
        (a number field then holds what the engine makes of them, not a value set by script)."""
        raise NotImplementedError

    def click(self, selector: str) -> None:
        """Click the element ``selector`` with the pointer."""
        raise NotImplementedError

    def select(self, selector: str, value: str) -> None:
        """Choose the option of ``value`` in the list ``selector``, as Playwright's select_option
        does: the value is set and the input and change events sent (classic WebDriver and BiDi
        have no command for it)."""
        chosen = self.evaluate(
            f"((list, value) => {{ if (![...list.options].some(o => o.value === value)) return false;"
            " list.value = value; list.dispatchEvent(new Event('input', {bubbles: true}));"
            " list.dispatchEvent(new Event('change', {bubbles: true})); return true; })"
            f"(document.querySelector({json.dumps(selector)}), {json.dumps(value)})"
        )
        if not chosen:
            raise BrowserError(f"{self.engine}: {selector} has no option {value!r}")

    def set_viewport(self, width: int, height: int) -> None:
        """Make the page's viewport ``width`` x ``height`` CSS pixels."""
        raise NotImplementedError

    def console_errors(self) -> list[str]:
        """The errors the page reported since it was loaded."""
        raise NotImplementedError

    def close(self) -> None:
        """End the browser and every process started for it."""
        raise NotImplementedError

    def wait_for(self, expression: str, timeout: float = 20, what: str = "") -> object:
        """Wait until ``expression`` is truthy in the page, ``timeout`` seconds at most; its value.
        The value comes back through JSON: an element reads as ``{}``, which is false here, so
        ``!!`` turns one into a boolean."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.engine}: {what or expression} not true after {timeout} s"
                )
            time.sleep(0.1)

    def __enter__(self) -> "Driver":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- Chromium: Playwright -------------------------------------------------------------------------
class ChromiumDriver(Driver):
    """Chromium through Playwright. Beyond :class:`Driver`, what only this one is asked for:
    screenshots, downloads, and a second person's page in the same browser."""

    engine = "chromium"

    def __init__(self, width: int = 1280, height: int = 900, *, _browser=None):
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
                viewport={"width": width, "height": height}, accept_downloads=True
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

    def another_person(self, width: int = 1280, height: int = 900) -> "ChromiumDriver":
        """A page with cookies of its own (a new browser context) in the same browser, for a
        second person; its ``close()`` closes that context only."""
        return ChromiumDriver(width, height, _browser=self._browser)

    def goto(self, url):
        self._errors.clear()
        self._page.goto(url)

    def evaluate(self, expression):
        return json.loads(self._page.evaluate(_json_wrapped(expression)))

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


# --- Firefox: WebDriver BiDi over a websocket -----------------------------------------------------
class _BidiConnection:
    """A WebDriver BiDi session: commands matched to their answers by id, events kept in order.
    The websocket lives on an event loop in a thread of its own; callers block, bounded."""

    def __init__(self, ws_url: str):
        self.events: list[dict] = []
        self._ids = count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._http = self._ws = None
        try:
            self._run(self._connect(ws_url), START_TIMEOUT_S)
        except BaseException:
            self.close()
            raise

    def _run(self, coroutine, timeout: float):
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, timeout), self._loop)
        try:
            return future.result(timeout + 5)
        except TimeoutError as exc:
            raise BrowserError(f"firefox: no answer within {timeout} s") from exc

    async def _connect(self, ws_url):
        import aiohttp

        self._http = aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(ws_url, max_msg_size=0, heartbeat=None)
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self):
        async for message in self._ws:
            data = json.loads(message.data)
            future = self._pending.pop(data.get("id"), None)
            if future is not None and not future.done():
                future.set_result(data)
            elif data.get("type") == "event":
                self.events.append(data)
        for future in self._pending.values():
            if not future.done():
                future.set_exception(BrowserError("firefox closed the BiDi connection"))

    async def _command(self, method, params):
        command_id = next(self._ids)
        future = self._loop.create_future()
        self._pending[command_id] = future
        await self._ws.send_str(json.dumps({"id": command_id, "method": method, "params": params}))
        return await future

    def send(self, method: str, params: dict, timeout: float = COMMAND_TIMEOUT_S) -> dict:
        answer = self._run(self._command(method, params), timeout)
        if answer.get("type") == "error":
            raise BrowserError(f"firefox: {method}: {answer['error']}: {answer.get('message')}")
        return answer["result"]

    def close(self):
        async def shut():
            try:
                if self._ws is not None:
                    await asyncio.wait_for(self._ws.close(), 2)
            except Exception:  # noqa: BLE001 - the browser may have closed it first
                pass
            finally:
                if self._http is not None:
                    await self._http.close()

        try:
            self._run(shut(), 5)
        except Exception:  # noqa: BLE001 - the browser may be gone already
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)


class FirefoxDriver(Driver):
    engine = "firefox"

    def __init__(self, width: int = 1280, height: int = 900):
        self._profile = Path(tempfile.mkdtemp(prefix="intune-firefox-"))
        # No first-run pages, update checks or telemetry: the machine has no internet.
        (self._profile / "user.js").write_text(
            'user_pref("browser.shell.checkDefaultBrowser", false);\n'
            'user_pref("datareporting.policy.dataSubmissionEnabled", false);\n'
            'user_pref("toolkit.telemetry.reportingpolicy.firstRun", false);\n'
            'user_pref("app.update.disabledForTesting", true);\n'
            'user_pref("browser.startup.homepage_override.mstone", "ignore");\n'
        )
        port = free_port()
        self._process = subprocess.Popen(
            [FIREFOX, "--headless", "--no-remote", "--profile", str(self._profile),
             f"--remote-debugging-port={port}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        self._bidi = None
        try:
            self._bidi = self._connect(port)
            self._bidi.send("session.new", {"capabilities": {}})
            self._bidi.send("session.subscribe", {"events": ["log.entryAdded"]})
            tree = self._bidi.send("browsingContext.getTree", {"maxDepth": 0})
            self._context = tree["contexts"][0]["context"]
            self.set_viewport(width, height)
        except Exception:
            self.close()
            raise
        self._errors_from = 0

    def _connect(self, port: int) -> _BidiConnection:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self._process.poll() is not None:
                raise BrowserError(f"firefox exited with {self._process.returncode} on start")
            try:
                return _BidiConnection(f"ws://127.0.0.1:{port}/session")
            except Exception as exc:  # noqa: BLE001 - not listening yet
                if time.monotonic() > deadline:
                    raise BrowserError(
                        f"firefox did not open WebDriver BiDi on port {port} "
                        f"within {START_TIMEOUT_S} s"
                    ) from exc
                time.sleep(0.2)

    def goto(self, url):
        self._errors_from = len(self._bidi.events)
        self._bidi.send(
            "browsingContext.navigate", {"context": self._context, "url": url, "wait": "complete"}
        )

    def _evaluate_raw(self, expression: str) -> dict:
        answer = self._bidi.send(
            "script.evaluate",
            {"expression": expression, "target": {"context": self._context},
             "awaitPromise": True, "resultOwnership": "none"},
        )  # fmt: skip
        if answer["type"] == "exception":
            details = answer["exceptionDetails"]
            raise BrowserError(f"firefox: {details.get('text')} in {expression[:200]}")
        return answer["result"]

    def evaluate(self, expression):
        return json.loads(self._evaluate_raw(_json_wrapped(expression))["value"])

    def _element(self, selector: str) -> dict:
        node = self._evaluate_raw(f"document.querySelector({json.dumps(selector)})")
        if node.get("type") != "node":
            raise BrowserError(f"firefox: no element matches {selector}")
        return {"sharedId": node["sharedId"]}

    def _perform(self, actions: list[dict]) -> None:
        self._bidi.send("input.performActions", {"context": self._context, "actions": actions})
        self._bidi.send("input.releaseActions", {"context": self._context})

    def type_into(self, selector, text):
        self.evaluate(
            f"(() => {{ const f = document.querySelector({json.dumps(selector)});"
            " f.value = ''; f.focus(); return true; })()"
        )
        keys = []
        for char in text:
            keys += [{"type": "keyDown", "value": char}, {"type": "keyUp", "value": char}]
        if keys:
            self._perform([{"type": "key", "id": "keyboard", "actions": keys}])

    def click(self, selector):
        self.evaluate(f"document.querySelector({json.dumps(selector)}).scrollIntoView()")
        element = self._element(selector)
        self._perform([{
            "type": "pointer", "id": "mouse", "parameters": {"pointerType": "mouse"},
            "actions": [
                {"type": "pointerMove", "x": 0, "y": 0, "origin": {"type": "element", "element": element}},
                {"type": "pointerDown", "button": 0},
                {"type": "pointerUp", "button": 0},
            ],
        }])  # fmt: skip

    def set_viewport(self, width, height):
        self._bidi.send(
            "browsingContext.setViewport",
            {"context": self._context, "viewport": {"width": width, "height": height}},
        )

    def console_errors(self):
        return [
            e["params"].get("text") or json.dumps(e["params"])
            for e in self._bidi.events[self._errors_from :]
            if e["method"] == "log.entryAdded" and e["params"].get("level") == "error"
        ]

    def close(self):
        try:
            if self._bidi is not None:
                try:
                    self._bidi.send("browser.close", {}, timeout=5)
                except Exception:  # noqa: BLE001 - killed below if it did not close
                    pass
                self._bidi.close()
        finally:
            _end(self._process)
            shutil.rmtree(self._profile, ignore_errors=True)


# --- WebKitGTK: WebKitWebDriver, classic WebDriver over HTTP, on Xvfb -----------------------------
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"


class WebKitDriver(Driver):
    engine = "webkit"

    def __init__(self, width: int = 1280, height: int = 900):
        self._xvfb = self._driver = None
        self._session = None
        try:
            self._display = self._start_xvfb()
            port = free_port()
            env = dict(os.environ) | {"DISPLAY": self._display}
            self._driver = subprocess.Popen(
                [WEBKIT_DRIVER, f"--port={port}"], env=env, start_new_session=True,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            self._http = httpx.Client(
                base_url=f"http://127.0.0.1:{port}", timeout=COMMAND_TIMEOUT_S + 5
            )
            self._wait_for_driver()
            answer = self._request(
                "POST",
                "/session",
                {"capabilities": {"alwaysMatch": {"pageLoadStrategy": "normal"}}},
                timeout=START_TIMEOUT_S,
            )
            self._session = f"/session/{answer['sessionId']}"
            self._request(
                "POST",
                f"{self._session}/timeouts",
                {"script": COMMAND_TIMEOUT_S * 1000, "pageLoad": COMMAND_TIMEOUT_S * 1000},
            )
            self.set_viewport(width, height)
        except Exception:
            self.close()
            raise

    def _start_xvfb(self) -> str:
        # Xvfb picks a free display itself and writes its number on the pipe.
        read_end, write_end = os.pipe()
        self._xvfb = subprocess.Popen(
            [XVFB, "-displayfd", str(write_end), "-screen", "0", "1920x1200x24", "-nolisten", "tcp"],
            pass_fds=(write_end,), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip
        os.close(write_end)
        deadline = time.monotonic() + START_TIMEOUT_S
        number = b""
        with os.fdopen(read_end, "rb", buffering=0) as pipe:
            os.set_blocking(pipe.fileno(), False)
            while not number.endswith(b"\n"):
                if time.monotonic() > deadline or self._xvfb.poll() is not None:
                    raise BrowserError(f"Xvfb did not start within {START_TIMEOUT_S} s")
                try:
                    number += pipe.read() or b""
                except BlockingIOError:
                    pass
                time.sleep(0.05)
        return f":{int(number)}"

    def _wait_for_driver(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self._driver.poll() is not None:
                raise BrowserError(f"WebKitWebDriver exited with {self._driver.returncode}")
            try:
                if self._http.get("/status", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise BrowserError(f"WebKitWebDriver did not answer within {START_TIMEOUT_S} s")
            time.sleep(0.2)

    def _request(self, method: str, path: str, body: dict | None = None, timeout=None):
        try:
            response = self._http.request(
                method, path, json=body, timeout=timeout or COMMAND_TIMEOUT_S + 5
            )
        except httpx.HTTPError as exc:
            raise BrowserError(f"webkit: {method} {path}: {exc!r}") from exc
        value = response.json().get("value") if response.content else None
        if response.status_code != 200:
            error = value or {}
            raise BrowserError(
                f"webkit: {method} {path}: {error.get('error')}: {error.get('message')}"
            )
        return value

    def goto(self, url):
        self._request("POST", f"{self._session}/url", {"url": url})
        self.evaluate(_ERROR_COLLECTOR)

    def evaluate(self, expression):
        script = (
            "const done = arguments[arguments.length - 1];"
            f"{_json_wrapped(expression)}.then((text) => done({{text}}),"
            " (error) => done({error: String(error && error.stack || error)}));"
        )
        answer = self._request(
            "POST", f"{self._session}/execute/async", {"script": script, "args": []}
        )
        if "error" in answer:
            raise BrowserError(f"webkit: {answer['error']} in {expression[:200]}")
        return json.loads(answer["text"])

    def _element(self, selector: str) -> str:
        found = self._request(
            "POST", f"{self._session}/element", {"using": "css selector", "value": selector}
        )
        return f"{self._session}/element/{found[ELEMENT]}"

    def type_into(self, selector, text):
        element = self._element(selector)
        self._request("POST", f"{element}/clear", {})
        if text:
            self._request("POST", f"{element}/value", {"text": text})

    def click(self, selector):
        self._request("POST", f"{self._element(selector)}/click", {})

    def set_viewport(self, width, height):
        # WebDriver sizes the window; the toolbar and borders take the difference, once measured.
        self._request("POST", f"{self._session}/window/rect", {"width": width, "height": height})
        inner = self.evaluate("[window.innerWidth, window.innerHeight]")
        if inner != [width, height]:
            outer = {"width": 2 * width - inner[0], "height": 2 * height - inner[1]}
            self._request("POST", f"{self._session}/window/rect", outer)

    def console_errors(self):
        # Classic WebDriver has no command to read the console (and MiniBrowser's
        # --enable-write-console-messages-to-stdout does not reach a page the driver opens):
        # what the page reports is collected from its load event on.
        return self.evaluate("window.__intuneErrors || []")

    def close(self):
        try:
            if self._session is not None:
                try:
                    self._request("DELETE", self._session, timeout=10)
                except BrowserError:
                    pass
        finally:
            if self._driver is not None:
                self._http.close()
            _end(self._driver)
            _end(self._xvfb)


def _end(process: subprocess.Popen | None, grace_s: float = 5) -> None:
    """SIGTERM the process group ``process`` leads, SIGKILL after ``grace_s``; reap it."""
    if process is None or process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(grace_s)
    except ProcessLookupError:
        pass


DRIVERS = {"chromium": ChromiumDriver, "firefox": FirefoxDriver, "webkit": WebKitDriver}


def launch(engine: str, width: int = 1280, height: int = 900) -> Driver:
    """A driver of ``engine`` with one page of ``width`` x ``height``."""
    return DRIVERS[engine](width, height)
