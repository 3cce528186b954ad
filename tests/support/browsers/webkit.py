"""WebKitGTK, Safari's engine, through WebKitWebDriver (classic WebDriver over HTTP, httpx) on an
Xvfb display of its own."""

import json
import os
import subprocess
import time

import httpx

from tests.support.browsers.driver import (
    COMMAND_TIMEOUT_S,
    START_TIMEOUT_S,
    BrowserError,
    Driver,
    end_process,
    json_wrapped,
)
from tests.support.ports import free_port

WEBKIT_DRIVER = "/usr/bin/WebKitWebDriver"
XVFB = "/usr/bin/Xvfb"
# Collects what the page reports as an error (for the engine whose protocol has no log events):
# uncaught errors, rejected promises and console.error. Kept in the tab's sessionStorage as well,
# so that what a page reports as it is left (a request in flight failing at the navigation)
# is read on the next page, as Firefox's log events and Playwright's console events are.
_ERRORS_KEY = "__intuneErrors"
_ERROR_COLLECTOR = """(() => {
  if (window.__intuneErrors) return true;
  const errors = window.__intuneErrors = [];
  const keep = (text) => {
    errors.push(text);
    try {
      const kept = JSON.parse(sessionStorage.getItem("KEY") || "[]");
      sessionStorage.setItem("KEY", JSON.stringify([...kept, text]));
    } catch (_) { /* no storage here (about:blank): window.__intuneErrors has it */ }
  };
  window.addEventListener("error", (e) => keep(String(e.message || e)));
  window.addEventListener("unhandledrejection", (e) => keep(`unhandled rejection: ${e.reason}`));
  const original = console.error;
  console.error = (...args) => { keep(args.map(String).join(" ")); original.apply(console, args); };
  return true;
})()""".replace("KEY", _ERRORS_KEY)
_READ_ERRORS = f"""(() => {{
  try {{ const kept = sessionStorage.getItem("{_ERRORS_KEY}"); if (kept !== null) return JSON.parse(kept); }}
  catch (_) {{ /* no storage here */ }}
  return window.__intuneErrors || [];
}})()"""
_FORGET_ERRORS = f"""(() => {{
  try {{ sessionStorage.removeItem("{_ERRORS_KEY}"); }} catch (_) {{ /* no storage here */ }}
  if (window.__intuneErrors) window.__intuneErrors.length = 0;
  return true;
}})()"""


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
        self.clear_console_errors()  # what the page left reports from here on is counted
        self._request("POST", f"{self._session}/url", {"url": url})
        self.evaluate(_ERROR_COLLECTOR)

    def evaluate(self, expression):
        script = (
            "const done = arguments[arguments.length - 1];"
            f"{json_wrapped(expression)}.then((text) => done({{text}}),"
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
        # what the page reports is collected from its load event on, and what the page before it
        # reported as it was left.
        return self.evaluate(_READ_ERRORS)

    def clear_console_errors(self):
        self.evaluate(_FORGET_ERRORS)

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
            end_process(self._driver)
            end_process(self._xvfb)
