"""Prepare the demo: an operator account, a job for the DLRM pipeline, this host, tuning on."""

import json
import os
import secrets
from pathlib import Path

import psutil
from django.contrib.auth.models import Group, User
from django.core.management.base import BaseCommand
from django.db import transaction

from agents.dlrm.schema import STAGE_NAMES
from webapp.jobs.models import Host, Job
from webapp.jobs.services import register_host, register_job
from webapp.permissions import OPERATORS_GROUP
from webapp.tuning.services import start_tuning


class Command(BaseCommand):
    help = "Create the demo user, a demo DLRM job and this host, start tuning, write the agent's credentials."

    def add_arguments(self, parser):
        parser.add_argument("--username", default="demo")
        parser.add_argument("--job", default="dlrm-demo", help="the demo job's name")
        parser.add_argument(
            "--url", default="http://127.0.0.1:8000", help="where the agent reaches the web server"
        )
        parser.add_argument(
            "--agent-env",
            type=Path,
            required=True,
            help="file to write the agent's INTUNE_* variables to",
        )
        parser.add_argument(
            "--no-tuning", action="store_true", help="do not start a tuning session"
        )

    @transaction.atomic
    def handle(self, *args, username, job, url, agent_env, no_tuning, **options):
        password = os.getenv("INTUNE_DEMO_PASSWORD") or secrets.token_urlsafe(12)
        operators, _ = Group.objects.get_or_create(name=OPERATORS_GROUP)
        user, _ = User.objects.get_or_create(username=username)
        user.set_password(password)
        user.is_staff = True
        user.save()
        user.groups.add(operators)

        demo_job = Job.objects.filter(name=job).first() or register_job(
            user=user,
            name=job,
            description="The DLRM ingestion pipeline running on this machine (make demo).",
            stages=[{"name": name} for name in STAGE_NAMES],
            tuner="intune",
            decision_interval_s=5.0,
        )
        host_name = "demo-host"
        host = Host.objects.filter(job=demo_job, name=host_name).first()
        if host is None:
            host, token = register_host(
                job=demo_job,
                user=user,
                name=host_name,
                cpus=float(psutil.cpu_count() or 1),
                memory_mb=psutil.virtual_memory().total / 2**20,
                worker_budget=None,
            )
        else:
            # The old token is not recoverable (only its hash is stored): issue a new one and
            # keep the host's history.
            token = Host.new_token()
            host.set_token(token)
            host.save(update_fields=["token_hash"])
        if not no_tuning:
            start_tuning(demo_job, user)
        agent_env.parent.mkdir(parents=True, exist_ok=True)
        agent_env.write_text(
            f"INTUNE_URL={url}\nINTUNE_HOST_ID={host.pk}\nINTUNE_AGENT_TOKEN={token}\n"
        )
        agent_env.chmod(0o600)
        self.stdout.write(
            json.dumps(
                {"username": username, "password": password, "job": demo_job.pk, "host": host.pk}
            )
        )
