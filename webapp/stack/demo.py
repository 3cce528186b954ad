"""``make demo``: the whole system on this machine, as child processes this command owns.

Starts (or uses, when REDIS_URL / DATABASE_URL are set) Redis and the database, migrates,
creates the demo user, job and host, starts tuning, then runs the web server, a Celery worker,
celery beat and one agent running the DLRM pipeline on this host. Ctrl-C stops them all.
"""

import argparse
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from agents.logs import configure_logging

from .embedded_redis import redis_url_or_embedded
from .services import command
from .supervisor import ProcessGroup, wait_until

log = logging.getLogger("intune.demo")
ROOT = Path(__file__).resolve().parents[2]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m webapp.stack.demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=8000, help="web server port (default 8000)")
    parser.add_argument(
        "--var-dir", type=Path, default=ROOT / "var", help="state, logs, SQLite and Redis files"
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="stop by itself after this long (default: run until Ctrl-C)",
    )
    parser.add_argument("--no-agent", action="store_true", help="do not start the demo agent")
    args = parser.parse_args(argv)
    configure_logging("INFO")

    var_dir = args.var_dir.resolve()
    var_dir.mkdir(parents=True, exist_ok=True)
    redis_url, embedded = redis_url_or_embedded(var_dir / "redis")
    env = dict(os.environ)
    env.update(
        {
            "REDIS_URL": redis_url,
            "INTUNE_VAR_DIR": str(var_dir),
            "INTUNE_BIND": f"127.0.0.1:{args.port}",
            "DJANGO_SETTINGS_MODULE": "webapp.settings",
            # Plain HTTP on 127.0.0.1: cookies cannot be Secure-only or the login would not stick.
            "INTUNE_SECURE_COOKIES": env.get("INTUNE_SECURE_COOKIES", "False"),
            "PYTHONUNBUFFERED": "1",
        }
    )
    python, bin_dir = sys.executable, str(Path(sys.executable).parent)
    group = ProcessGroup(log_dir=var_dir / "logs")
    stop = threading.Event()

    def on_signal(signum, frame):
        log.info("received %s: stopping every process", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    try:
        subprocess.run(
            command("migrate", python), env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL
        )
        url = f"http://127.0.0.1:{args.port}"
        agent_env = var_dir / "demo-agent.env"
        setup = subprocess.run(
            [python, "manage.py", "intune_demo_setup", "--url", url, "--agent-env", str(agent_env)],
            env=env,
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        )
        login = json.loads(setup.stdout.strip().splitlines()[-1])
        for name in ("web", "worker", "beat"):
            group.start(name, command(name, python, bin_dir), env, cwd=ROOT)
        wait_until(
            lambda: httpx.get(f"{url}/healthz", timeout=2).status_code == 200,
            60,
            what="the web server",
        )
        if not args.no_agent:
            agent_vars = dict(line.split("=", 1) for line in agent_env.read_text().split())
            group.start("agent", command("agent", python, bin_dir), env | agent_vars, cwd=ROOT)
        print(
            f"\n  InTune is running: {url}/\n"
            f"  Log in as {login['username']} with password {login['password']}\n"
            f"  Logs: {var_dir / 'logs'}    Stop: Ctrl-C\n",
            flush=True,
        )
        deadline = time.monotonic() + args.seconds if args.seconds else None
        while not stop.is_set():
            dead = group.poll_dead()
            if dead:
                log.error("%s exited; see %s. Stopping.", ", ".join(dead), var_dir / "logs")
                return 1
            if deadline is not None and time.monotonic() > deadline:
                break
            stop.wait(0.5)
        return 0
    finally:
        # The agent first, while the web server takes its last samples; then the web server,
        # worker and beat at once: none needs another to stop cleanly.
        group.stop("agent")
        group.stop_all(together=True)
        if embedded is not None:
            embedded.stop()
        log.info("every process stopped")


if __name__ == "__main__":
    sys.exit(main())
