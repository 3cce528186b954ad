"""Firefox ESR over WebDriver BiDi: a websocket (aiohttp) on an event loop of its own."""

import asyncio
import json
import shutil
import subprocess
import tempfile
import threading
import time
from itertools import count
from pathlib import Path

from tests.support.browsers.driver import (
    COMMAND_TIMEOUT_S,
    START_TIMEOUT_S,
    BrowserError,
    Driver,
    end_process,
    json_wrapped,
)
from tests.support.ports import free_port

FIREFOX = "/usr/bin/firefox-esr"


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
        return json.loads(self._evaluate_raw(json_wrapped(expression))["value"])

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

    def clear_console_errors(self):
        self._errors_from = len(self._bidi.events)

    def close(self):
        try:
            if self._bidi is not None:
                try:
                    self._bidi.send("browser.close", {}, timeout=5)
                except Exception:  # noqa: BLE001 - killed below if it did not close
                    pass
                self._bidi.close()
        finally:
            end_process(self._process)
            shutil.rmtree(self._profile, ignore_errors=True)
