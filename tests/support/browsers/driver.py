"""What a test does with a page, the same in every engine (:class:`Driver`), and what the
engines' drivers share."""

import json
import os
import signal
import subprocess
import time

START_TIMEOUT_S = 30
COMMAND_TIMEOUT_S = 30


class BrowserError(RuntimeError):
    """The browser or its driver answered with an error, or not in time."""


def json_wrapped(expression: str) -> str:
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
        """The errors the page reported since it was loaded, and those the page before it
        reported as it was left (in WebKit, those it reported once its scripts had run)."""
        raise NotImplementedError

    def clear_console_errors(self) -> None:
        """Forget the errors so far: a test that made the page fail on purpose, and checked them,
        leaves the page to the next test without them."""
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


def end_process(process: subprocess.Popen | None, grace_s: float = 5) -> None:
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
