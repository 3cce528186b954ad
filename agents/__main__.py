"""``intune-agent`` (also ``python -m agents``): run a pipeline, its trainer and the agent.

Examples::

    # register this host under job 7 once; the token is kept in ~/.intune-agent/agent.json
    intune-agent --url http://intune:8000 --job 7 --api-token $TOKEN --pipeline dlrm

    # the built-in DLRM pipeline over your own Criteo files (.tsv, .csv, .gz, .bz2, Spark's
    # part-00000, Hive's 000000_0, npy days or Parquet), skipping
    # malformed lines instead of stopping on the first
    intune-agent --url http://intune:8000 --job 7 --api-token $TOKEN \\
        --data-dir /data/criteo --bad-lines skip

    # a host registered already (token from the operator, or the state file)
    INTUNE_URL=http://intune:8000 INTUNE_HOST_ID=3 INTUNE_AGENT_TOKEN=ia_... \\
        intune-agent --pipeline mypkg.data:build_pipeline --no-train

    # one agent for the 8 local ranks of a torchrun job: each rank's agents.attach() reports
    # to it (without a sidecar, the first rank to start hosts the agent)
    intune-agent --url http://intune:8000 --job 7 --api-token $TOKEN --sidecar --ranks 8
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from agents.logs import configure_logging
from agents.pipeline.signals import SLICE_S, SignalledStop

log = logging.getLogger("agents")


def add_identity_arguments(parser: argparse.ArgumentParser) -> argparse._ArgumentGroup:
    """The control plane and this host's identity, as ``resolve_identity`` reads them
    (``intune-agent`` and ``intune-run`` both take them); returns their group."""
    who = parser.add_argument_group("control plane and identity")
    who.add_argument(
        "--url", default=os.environ.get("INTUNE_URL"), help="control plane URL (env INTUNE_URL)"
    )
    who.add_argument(
        "--host-id",
        type=int,  # argparse converts a string default too, so a bad env value is reported
        default=os.environ.get("INTUNE_HOST_ID") or None,
        help="this host's id on the control plane (env INTUNE_HOST_ID)",
    )
    who.add_argument(
        "--token",
        default=os.environ.get("INTUNE_AGENT_TOKEN"),
        help="this host's agent token, ia_... (env INTUNE_AGENT_TOKEN)",
    )
    who.add_argument("--job", type=int, help="register this host under job ID (with --api-token)")
    who.add_argument("--api-token", help="a person's API token, used only to register the host")
    who.add_argument("--name", default=socket.gethostname(), help="host name when registering")
    who.add_argument(
        "--state-dir",
        default="~/.intune-agent",
        help="where the agent token and last sequence number are kept (default %(default)s)",
    )
    return who


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``intune-agent``."""
    p = argparse.ArgumentParser(
        prog="intune-agent",
        description=(
            "InTune's host agent: runs the ingestion pipeline (and a trainer on it), reports\n"
            "host, stage and trainer measurements to the control plane every interval, and\n"
            "applies the CPU allocations the control plane sends (long-poll, no inbound port).\n"
            "When the control plane is away, training goes on and samples are buffered."
        ),
        epilog=__doc__.split("Examples::", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_identity_arguments(p)
    ranks = p.add_argument_group("multi-rank hosts (torchrun --nproc-per-node N)")
    ranks.add_argument(
        "--sidecar",
        action="store_true",
        help="run no pipeline: serve this host's local ranks, whose agents.attach() connect "
        "over a local socket, as one host (docs/architecture.md, 'Multi-rank hosts')",
    )
    ranks.add_argument(
        "--ranks",
        type=int,
        default=None,
        help="local ranks on this host (default: what the launcher set, LOCAL_WORLD_SIZE for "
        "torchrun, or mpirun's or srun's own, else 1); registering sends it",
    )
    ranks.add_argument(
        "--rank-socket",
        default=None,
        help="the ranks' socket: a path or @name (abstract); default INTUNE_RANK_SOCKET or a "
        "name derived from --url and the host id, as agents.attach() derives it",
    )
    ranks.add_argument(
        "--rebalance",
        type=float,
        default=10.0,
        help="seconds between re-splits of the allocation among the ranks by their measured "
        "need, when worth it (0: split only when an allocation arrives; default %(default)s)",
    )
    work = p.add_argument_group("pipeline and training")
    work.add_argument(
        "--pipeline",
        default="dlrm",
        help="'dlrm' (the built-in DLRM ingestion pipeline) or module:factory returning a "
        "Pipeline (default %(default)s)",
    )
    work.add_argument(
        "--fuse",
        default=None,
        metavar="GROUPS",
        help="with --pipeline dlrm, run neighbouring stages in one worker, e.g. "
        "read+parse+transform+collate (fewer hand-offs; pays on hosts with few cores, see "
        "docs/benchmarks.md); groups separated by commas",
    )
    work.add_argument(
        "--data-dir",
        default=None,
        metavar="DIR",
        help="with --pipeline dlrm, read this folder of Criteo files as they come (.tsv, "
        ".txt, tab-separated .csv, each maybe .gz, .bz2, .deflate or .zst; Spark's part-00000 and "
        "Hive's 000000_0, read by what they hold; indexed once, the index kept beside them), "
        "of TorchRec npy days or of Parquet files (see --data-format) instead of a generated "
        "dataset; or an object-store URL (s3://bucket/prefix, gs://..., any fsspec URL; "
        "needs the store's package, e.g. pip install 'intune[s3]'; credentials and endpoint "
        "from the store's usual settings, e.g. AWS_PROFILE, AWS_ENDPOINT_URL_S3)",
    )
    work.add_argument(
        "--data-format",
        choices=["auto", "raw", "npy", "parquet"],
        default=None,
        help="with --data-dir, the layout of its files: raw Criteo text, TorchRec's npy days "
        "(day_0_dense.npy, _sparse.npy, _labels.npy) or Parquet (columns label, I1..I13, "
        "C1..C26; needs pip install 'intune[parquet]'); default auto: found from the names",
    )
    work.add_argument(
        "--bad-lines",
        choices=["error", "skip"],
        default=None,
        help="with --data-dir, what a malformed line (or npy/Parquet row) does: 'error' stops "
        "the pipeline naming the file and line (default), 'skip' drops it and counts it",
    )
    work.add_argument(
        "--train",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with --pipeline dlrm, train the DLRM model on the batches; --no-train (or a "
        "module:factory pipeline) only drains the pipeline as the consumer",
    )
    work.add_argument(
        "--seconds", type=float, default=None, help="stop after this many seconds (default: never)"
    )
    agent = p.add_argument_group("agent")
    agent.add_argument("--interval", type=float, default=1.0, help="seconds between samples")
    agent.add_argument(
        "--batch-seconds", type=float, default=5.0, help="seconds between batches sent"
    )
    agent.add_argument(
        "--buffer-samples",
        type=int,
        default=3600,
        help="samples held while the control plane is away; oldest dropped beyond (default "
        "%(default)s: one hour at 1 Hz)",
    )
    agent.add_argument(
        "--worker-budget",
        type=int,
        default=None,
        help="CPU slots of all stages together: a worker that computes takes one, one that "
        "waits the CPU it was measured to use (default: whole CPUs + number of stages)",
    )
    agent.add_argument(
        "--memory-budget-mb",
        type=float,
        default=None,
        help="most memory in MB the pipeline's workers may hold of their own (default: 80%% of "
        "the host's memory limit less what the host holds besides them, the trainer included)",
    )
    agent.add_argument(
        "--poll-wait", type=float, default=30.0, help="seconds one allocation long-poll is held"
    )
    agent.add_argument(
        "--prometheus-port", type=int, default=None, help="serve Prometheus metrics on this port"
    )
    agent.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING (default INFO)")
    return p


def load_pipeline(
    spec: str,
    fuse: str | None = None,
    data_dir: str | None = None,
    bad_lines: str | None = None,
    data_format: str | None = None,
) -> Any:
    """Build the pipeline named by ``spec``: ``dlrm`` (fused as ``fuse`` says, over the
    Criteo files of ``data_dir`` with the ``bad_lines`` policy, or a generated dataset) or
    ``module:factory`` (found by ``agents.pipeline.loading.load_factory``)."""
    if spec != "dlrm":
        given = [
            flag
            for flag, value in (
                ("--fuse", fuse),
                ("--data-dir", data_dir),
                ("--bad-lines", bad_lines),
                ("--data-format", data_format),
            )
            if value is not None
        ]
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise SystemExit(
                f"{' and '.join(given)} {verb} to --pipeline dlrm only; a module:factory "
                "pipeline fuses its own stages (agents.pipeline.fuse_groups) and reads its own data"
            )
    if data_format is not None and data_dir is None:
        raise SystemExit("--data-format applies to the files of --data-dir")
    if bad_lines is not None and data_dir is None:
        raise SystemExit(
            "--bad-lines applies to the Criteo files of --data-dir; a generated dataset has no "
            "malformed lines"
        )
    url = data_dir is not None and "://" in data_dir
    if data_dir is not None and not url and Path(data_dir).expanduser().is_file():
        raise SystemExit(
            f"--data-dir {data_dir}: a file; give the folder that holds it "
            f"({Path(data_dir).expanduser().parent})"
        )
    if data_dir is not None and not url and not Path(data_dir).expanduser().is_dir():
        raise SystemExit(
            f"--data-dir {data_dir}: no such folder; give a folder of Criteo files (.tsv, .txt, "
            ".csv, .gz, .bz2, .deflate, Spark's part-00000), of TorchRec npy days or of Parquet "
            "files"
        )
    from agents.pipeline.loading import load_factory

    try:
        factory = load_factory(spec)
    except ValueError as exc:
        raise SystemExit(f"--pipeline {spec}: {exc}") from exc
    if spec == "dlrm":
        options: dict[str, Any] = {"fuse": fuse}
        if data_dir is not None:
            where = data_dir if url else Path(data_dir).expanduser()
            options.update(data_dir=where, bad_lines=bad_lines or "error")
            options.update(data_format=data_format or "auto")
        try:
            return factory(**options)
        except (OSError, ImportError) as exc:  # no Criteo files; no store; no pyarrow
            raise SystemExit(f"--data-dir {data_dir}: {exc}") from exc
        except ValueError as exc:
            what = f"--fuse {fuse}" if fuse else f"--data-dir {data_dir}"
            raise SystemExit(f"{what}: {exc}") from exc
    try:
        pipeline = factory()
    except Exception as exc:
        log.error("--pipeline %s: the factory raised", spec, exc_info=True)
        raise SystemExit(
            f"--pipeline {spec}: the factory raised {type(exc).__name__}: {exc}"
        ) from exc
    missing = [m for m in PIPELINE_METHODS if not callable(getattr(pipeline, m, None))]
    if missing or not hasattr(pipeline, "stage_names"):
        raise SystemExit(
            f"--pipeline {spec}: the factory returned {type(pipeline).__name__}, not a pipeline "
            "(agents.pipeline.Pipeline, or an object with stage_names and "
            f"{', '.join(PIPELINE_METHODS)}); it lacks {', '.join(missing) or 'stage_names'}"
        )
    return pipeline


PIPELINE_METHODS = ("start", "stop", "apply", "check", "metrics", "__iter__")
"""What the agent calls on the pipeline it runs (``agents.pipeline.Pipeline`` has them all)."""


class StoppedWhileBuilding(BaseException):
    """SIGINT or SIGTERM came while the pipeline was being built (a ``BaseException``, so a
    factory's ``except Exception`` does not swallow it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def build_interruptibly(build: Callable[[], Any], check: Callable[[Any], None]) -> Any:
    """``build()`` the pipeline and ``check(pipeline)`` it, a SIGINT or SIGTERM meanwhile
    raising :class:`StoppedWhileBuilding` where the main thread is.

    A factory may wait for minutes (a dataset generated, a mount, a download) or for ever (a
    read with no timeout); with the agent's note-only handlers installed before it, nothing
    looked at the note until it returned: Ctrl-C and SIGTERM did nothing (a blocked factory:
    still running 10 s after SIGTERM). No thread of the agent runs yet, so raising from the
    handler is safe here."""

    def interrupt(signum: int, frame: Any) -> None:
        raise StoppedWhileBuilding(signum)

    previous = {s: signal.signal(s, interrupt) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        pipeline = build()
        check(pipeline)
        return pipeline
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def check_stages_match_the_job(state: Any, pipeline: Any) -> None:
    """Exit with both lists when the host's job names other stages than the pipeline has
    (``agents.daemon.checks.job_stages_problem``), or when the control plane refuses this
    agent outright."""
    from agents.daemon.checks import job_stages_problem, reported_stage_names

    names = reported_stage_names(pipeline)
    if problem := job_stages_problem(state.url, state.host_id, state.agent_token, names):
        raise SystemExit(problem)


def resolve_identity(args: argparse.Namespace) -> tuple[Any, Any]:
    """Return who this agent is (an AgentState), registering the host when asked, and the
    state directory to keep that state in (``None``: identity from flags, nothing to keep)."""
    from agents.client import register_host
    from agents.daemon.state import AgentState
    from agents.host import HostLimits

    saved = AgentState.load(args.state_dir)
    if args.job is not None:
        if not args.url or not args.api_token:
            raise SystemExit("--job registers this host: it needs --url and --api-token too")
        if saved and saved.url == args.url.rstrip("/") and saved.job_id == args.job:
            log.info("reusing host %d of job %d from %s", saved.host_id, args.job, args.state_dir)
            return saved, args.state_dir
        limits = HostLimits.detect()
        answer = register_host(
            args.url,
            args.job,
            args.api_token,
            name=args.name,
            cpus=limits.cpus,
            memory_mb=round(limits.memory_limit_mb),
            worker_budget=args.worker_budget,
            ranks=args.ranks,
        )
        state = AgentState(
            url=args.url.rstrip("/"),
            host_id=int(answer["id"]),
            agent_token=answer["agent_token"],
            job_id=args.job,
            name=args.name,
            last_seq=saved.last_seq if saved else 0,
        )
        path = state.save(args.state_dir)
        log.info("registered as host %d of job %d; token kept in %s", state.host_id, args.job, path)
        return state, args.state_dir
    if args.url and args.host_id is not None and args.token:
        if saved and saved.host_id == args.host_id and saved.url == args.url.rstrip("/"):
            saved.agent_token = args.token
            return saved, args.state_dir
        return AgentState(url=args.url, host_id=args.host_id, agent_token=args.token), None
    if saved:
        log.info("using host %d at %s from %s", saved.host_id, saved.url, args.state_dir)
        return saved, args.state_dir
    raise SystemExit(
        "the agent needs to know who it is: pass --url, --host-id and --token (or set "
        "INTUNE_URL, INTUNE_HOST_ID, INTUNE_AGENT_TOKEN), or register with --url, --job and "
        "--api-token"
    )


def start_consumer(
    pipeline: Any, args: argparse.Namespace, stop: threading.Event | SignalledStop
) -> tuple[Consumer, Callable[[], dict] | None]:
    """Start the thread that consumes the pipeline: the DLRM trainer, or a plain drain."""
    if args.pipeline == "dlrm" and args.train:
        from agents.dlrm.trainer import Trainer

        trainer = Trainer(None)
        thread = Consumer(lambda: trainer.run(pipeline, stop), stop, "intune-trainer")
        thread.start()
        return thread, trainer.stats

    from agents.pipeline.consume import consume_until

    thread = Consumer(lambda: consume_until(pipeline, stop), stop, "intune-drain")
    thread.start()
    return thread, None


class Consumer(threading.Thread):
    """The thread that consumes the pipeline; it stops the agent when it ends on its own, on
    an exhausted pipeline (a finite source) or a failure, and keeps which as ``outcome``."""

    def __init__(
        self, target: Callable[[], None], stop: threading.Event | SignalledStop, name: str
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._consume = target
        self._stop_agent = stop
        self.outcome: str | Exception | None = None

    def run(self) -> None:
        try:
            self._consume()
            if not self._stop_agent.is_set():
                self.outcome = "the pipeline is exhausted"
                log.info("the pipeline is exhausted (its source ended); stopping the agent")
        except Exception as exc:
            self.outcome = exc
            log.error("the consumer failed; stopping the agent", exc_info=True)
        finally:
            self._stop_agent.set()


def serve_ranks(args: argparse.Namespace, config: Any, stop: Any, remember: Any) -> int:
    """``--sidecar``: the host's one agent for its local ranks, until stopped."""
    from agents.daemon import ranks as host_ranks
    from agents.daemon.agent import Agent

    address = (
        host_ranks.socket_address(args.rank_socket)
        if args.rank_socket
        else host_ranks.default_address(config.url, config.host_id)
    )
    listener = host_ranks.bind_listener(address)
    if listener is None:
        raise SystemExit(
            f"another agent serves this host's ranks on {address.replace(chr(0), '@')} already"
        )
    hub = host_ranks.HostPipelines(
        listener, args.ranks, interval_s=args.interval, rebalance_s=args.rebalance or None
    ).start()
    deadline = time.monotonic() + args.seconds if args.seconds else None
    agent = None
    try:
        log.info("waiting for the first of %d local ranks to attach", args.ranks)
        while not hub.wait_for_stages(SLICE_S):
            if stop.is_set() or (deadline is not None and time.monotonic() >= deadline):
                return 0
        agent = Agent(hub, config, on_shipped=remember).start()
        while not stop.wait(1.0):
            if deadline is not None and time.monotonic() >= deadline:
                break
    finally:
        if agent is not None:
            agent.stop()
        hub.stop()
    return 0


def main(argv: list[str] | None = None) -> NoReturn:
    """The ``intune-agent`` command: :func:`run`, then end the process with its status at once
    (:func:`leave`). A bad command line or identity exits as ``run`` says, by ``SystemExit``."""
    leave(run(argv))


def leave(status: int) -> NoReturn:
    """End the process with ``status`` now that the agent has stopped: the ``atexit`` handlers
    run (the log handlers are flushed and closed; multiprocessing's finalizers and a user
    pipeline's own handlers run), then ``os._exit`` skips the interpreter's teardown.

    That teardown was most of a DLRM agent's exit. After its stop had returned (the last batch
    sent, the workers ended, their shared memory removed, the trainer's step in progress let
    end: 0.1 to 1.3 s, most of it that step), the interpreter's last garbage collections over
    the 300,000 objects that torch, the pipeline and the model leave took another 0.4 to 1.6 s
    on a 2-core host shared with other work (0.3 to 0.4 s of CPU), where a counting pipeline's
    agent had exited in 0.2 s in all. Nothing in it is needed: its stop has done what the agent
    must leave behind, and the kernel frees the rest. A daemon thread still inside torch (a
    trainer step past the consumer's join) is not torn down under it either. ``SystemExit``
    from a bad command line never gets here: it exits as usual.
    """
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed, or a pipe whose reader left
            stream.flush()
    os._exit(status)


def run(argv: list[str] | None = None) -> int:
    """Run the agent until SIGINT/SIGTERM (or ``--seconds``); return the exit status."""
    args = build_parser().parse_args(argv)
    if args.ranks is None:
        from agents.daemon.ranks import local_rank_and_world

        try:
            _, args.ranks = local_rank_and_world(rank=0)
        except ValueError as exc:
            raise SystemExit(f"--ranks: {exc}") from None
    if args.ranks < 1:
        raise SystemExit(f"--ranks {args.ranks}: a host runs at least one rank")
    # One line per record in a log file or journald, rich on a terminal (agents/logs.py).
    configure_logging(args.log_level)
    if logging.getLogger().level > logging.DEBUG:
        # httpx logs every request at INFO: one line a second says nothing the agent does not.
        logging.getLogger("httpx").setLevel(logging.WARNING)

    from agents.daemon.agent import Agent, AgentConfig

    # Who we are first: a missing token should not wait for a dataset to be generated.
    state, state_dir = resolve_identity(args)
    first_seq = max(time.time_ns() // 10**6, state.last_seq + 1)

    last_saved = [0.0]

    def remember(seq: int) -> None:
        # Keep the sequence on disk so a restart continues above it; at most every 30 s.
        state.last_seq = seq
        if state_dir is not None and time.monotonic() - last_saved[0] > 30:
            state.save(state_dir)
            last_saved[0] = time.monotonic()

    # The handler only notes the signal: setting an Event takes its lock, which the main
    # thread may hold at that very moment (inside stop.wait()), and the agent hung there.
    # Every wait on it lasts at most 0.2 s before it looks at the note.
    stop = SignalledStop()

    config = AgentConfig(
        url=state.url,
        host_id=state.host_id,
        token=state.agent_token,
        interval_s=args.interval,
        batch_seconds=args.batch_seconds,
        buffer_samples=args.buffer_samples,
        worker_budget=args.worker_budget,
        memory_budget_mb=args.memory_budget_mb,
        poll_wait_s=args.poll_wait,
        prometheus_port=args.prometheus_port,
        first_seq=first_seq,
    )
    if args.sidecar:
        stop.install((signal.SIGINT, signal.SIGTERM))
        try:
            return serve_ranks(args, config, stop, remember)
        finally:
            if state_dir is not None:
                state.save(state_dir)
    try:
        pipeline = build_interruptibly(
            lambda: load_pipeline(
                args.pipeline, args.fuse, args.data_dir, args.bad_lines, args.data_format
            ),
            lambda built: check_stages_match_the_job(state, built),
        )
    except StoppedWhileBuilding as exc:
        log.info("stopped by %s while building the pipeline", signal.Signals(exc.signum).name)
        return 0
    stop.install((signal.SIGINT, signal.SIGTERM))
    pipeline.start()
    consumer, trainer_stats = start_consumer(pipeline, args, stop)
    agent = Agent(pipeline, config, trainer_stats=trainer_stats, on_shipped=remember).start()
    deadline = time.monotonic() + args.seconds if args.seconds else None
    try:
        while not stop.wait(min(60.0, args.seconds or 60.0)):
            log.info(
                "allocation v%s %s; shipped %d samples, %d buffered, %d dropped%s",
                agent.applied_version,
                pipeline.allocation,
                agent.shipped_total,
                len(agent.buffer),
                agent.buffer.dropped_total,
                f"; last error: {agent.last_error}" if agent.last_error else "",
            )
            if deadline is not None and time.monotonic() >= deadline:
                break
    finally:
        stop.set()
        agent.stop()
        pipeline.stop()
        consumer.join(5)
        if state_dir is not None:
            state.save(state_dir)
    # A failed consumer (a stage's error, the trainer's) is the run's failure too.
    return 1 if isinstance(consumer.outcome, Exception) else 0


if __name__ == "__main__":
    main()
