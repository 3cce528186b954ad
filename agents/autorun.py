"""``intune-run``: tune the torch DataLoaders of a training command that was not changed.

Examples::

    # a host registered already: its id and agent token from the operator
    INTUNE_URL=http://intune:8000 INTUNE_HOST_ID=3 INTUNE_AGENT_TOKEN=ia_... \\
        intune-run python train.py --epochs 10

    # register this host under job 7 first (the token is kept in ~/.intune-agent/agent.json)
    intune-run --url http://intune:8000 --job 7 --api-token $TOKEN -- python train.py

    # every rank of a torchrun job: the ranks share one agent for the host
    intune-run --url http://intune:8000 --job 7 --api-token $TOKEN --ranks 8 -- \\
        torchrun --nproc-per-node 8 train.py

The command runs with ``torch.utils.data.DataLoader`` replaced, in every Python process it
starts, by ``agents.torch.DataLoader`` (a subclass of torch's, so ``isinstance`` checks and
the batches are torch's), wherever the script asks for ``num_workers`` above 0; a loader with
``num_workers=0`` stays torch's own, loading in the training process. In each process the
loader with the most batches among those built when the first iteration starts (the training
set, as a rule) is attached to the control plane (``agents.attach``); ``--loader N`` picks the
N-th built instead. Tuning never stops training: a control plane that is away, or a job whose
stages are not the loader's, is logged and the loader runs with the workers it asked for.

How: the command's environment gets ``PYTHONPATH`` led by a directory holding a
``sitecustomize`` module (the way ``ddtrace-run`` and ``opentelemetry-instrument`` work),
which registers a hook that patches torch once torch is imported; processes that never import
torch are not touched. A ``sitecustomize`` of the environment's own still runs after ours.
Interpreters started with ``-I``, ``-E`` or ``-S`` skip it: change the import instead
(``from agents.torch import DataLoader``).
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import NoReturn

log = logging.getLogger("agents.autorun")

ENV = "INTUNE_AUTO"  # "1": patch torch in this process (set by intune-run)
LOADER_ENV = "INTUNE_AUTO_LOADER"  # "largest" (default) or N, the N-th loader built
LOG_LEVEL_ENV = "INTUNE_AUTO_LOG_LEVEL"
STATEFUL_ENV = "INTUNE_AUTO_STATEFUL"  # "1": tune torchdata's StatefulDataLoader (--tune-stateful)
SITE_DIR = Path(__file__).resolve().parent / "autorun_site"


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``intune-run``."""
    p = argparse.ArgumentParser(
        prog="intune-run",
        description=(
            "Run a training command with its torch DataLoaders tuned live by InTune, without\n"
            "changing its code: DataLoader is agents.torch.DataLoader in every Python process\n"
            "of the command, and the training loader reports to the control plane."
        ),
        epilog=__doc__.split("Examples::", 1)[1].split("\nThe command runs", 1)[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from agents.__main__ import add_identity_arguments

    who = add_identity_arguments(p)
    who.add_argument(
        "--ranks", type=int, default=1,
        help="when registering: the training processes on this host (torchrun --nproc-per-node)",
    )  # fmt: skip
    who.add_argument(
        "--worker-budget", type=int, default=None,
        help="when registering: CPU slots of all stages together (default: whole CPUs + stages)",
    )  # fmt: skip
    p.add_argument(
        "--loader", default=os.environ.get(LOADER_ENV, "largest"),
        help="which loader of each process to tune: 'largest' (most batches among those built "
        "when the first iteration starts; default) or N, the N-th built (0 first)",
    )  # fmt: skip
    p.add_argument(
        "--tune-stateful", action="store_true",
        default=os.environ.get(STATEFUL_ENV) == "1",
        help="also tune torchdata's StatefulDataLoader over a map-style dataset (built as "
        "agents.torch.StatefulDataLoader: torchdata's batches and resumes, but its state_dict() "
        "in agents.torch's own format, which torchdata's loader does not read, nor ours "
        "torchdata's); without it such a loader stays torchdata's, untuned",
    )  # fmt: skip
    p.add_argument("--log-level", default="INFO", help="the agent's log level in the command")
    p.add_argument(
        "command", nargs=argparse.REMAINDER, help="the training command and its arguments"
    )
    return p


def command_environment(
    url: str, host_id: int, token: str, loader: str, log_level: str
) -> dict[str, str]:
    """The environment the command runs in: ours plus the identity and the ``sitecustomize``
    directory ahead of ``PYTHONPATH``."""
    env = dict(os.environ)
    path = [str(SITE_DIR)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env.update(
        {
            "PYTHONPATH": os.pathsep.join(path),
            ENV: "1",
            LOADER_ENV: loader,
            LOG_LEVEL_ENV: log_level.upper(),
            "INTUNE_URL": url,
            "INTUNE_HOST_ID": str(host_id),
            "INTUNE_AGENT_TOKEN": token,
        }
    )
    return env


def main(argv: list[str] | None = None) -> NoReturn:
    """Resolve who this host is (registering it when asked), then replace this process with
    the command. Exits 2 with a message for a bad command line or identity."""
    parser = build_parser()
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the training command to run, e.g. intune-run -- python train.py")
    if args.loader != "largest" and not args.loader.isdigit():
        parser.error(f"--loader must be 'largest' or a number, not {args.loader!r}")
    if shutil.which(command[0]) is None:
        parser.error(f"{command[0]!r}: no such command on PATH")
    from agents.__main__ import resolve_identity
    from agents.client import ControlPlaneError
    from agents.logs import configure_logging

    configure_logging(args.log_level)
    if args.tune_stateful:
        os.environ[STATEFUL_ENV] = "1"
    env = dict(os.environ)
    try:
        state, _ = resolve_identity(args)
    except SystemExit as exc:
        parser.exit(2, f"intune-run: {exc}\n")
    except ControlPlaneError as exc:
        # Tuning never stops training: a fleet's jobs start while the control plane is away.
        log.warning("could not register this host (%s); running %s untuned", str(exc), command[0])
    else:
        env = command_environment(
            state.url, state.host_id, state.agent_token, args.loader, args.log_level
        )
        log.info(
            "running %s with its loaders tuned as host %d at %s",
            command[0], state.host_id, state.url,
        )  # fmt: skip
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os.execvpe(command[0], command, env)


def install() -> None:
    """Patch torch's DataLoader in this process once torch is imported (``sitecustomize``)."""
    import wrapt

    wrapt.register_post_import_hook(_torch_imported, "torch")


def _torch_imported(module: object) -> None:
    try:
        from agents.torch import auto

        auto.patch(os.environ.get(LOADER_ENV, "largest"), os.environ.get(LOG_LEVEL_ENV, "INFO"))
    except Exception:  # noqa: BLE001 - tuning never stops training
        log.exception("intune-run: could not patch torch's DataLoader; training runs untuned")
