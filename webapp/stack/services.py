"""The command of each service of the stack: one definition for the demo, the tests and
docker-compose.yml (a test checks that the compose file runs exactly these)."""

SERVICE_COMMANDS: dict[str, list[str]] = {
    "migrate": ["python", "manage.py", "migrate", "--noinput"],
    "web": ["gunicorn", "-c", "webapp/gunicorn_conf.py", "webapp.asgi:application"],
    "worker": [
        "celery",
        "-A",
        "webapp",
        "worker",
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
    ],
    "beat": ["celery", "-A", "webapp", "beat", "--loglevel", "INFO"],
    "agent": ["python", "-m", "agents", "--pipeline", "dlrm"],
}


def command(service: str, python: str, bin_dir: str | None = None) -> list[str]:
    """The service's argv with ``python`` (and console scripts from ``bin_dir``) resolved."""
    argv = list(SERVICE_COMMANDS[service])
    if argv[0] == "python":
        argv[0] = python
    elif bin_dir:
        argv[0] = f"{bin_dir}/{argv[0]}"
    return argv
