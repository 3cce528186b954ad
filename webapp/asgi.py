"""ASGI entry point: ``gunicorn -c webapp/gunicorn_conf.py webapp.asgi:application`` (uvicorn
workers). Agents' endpoints go through webapp/agent_asgi.py, everything else to Django."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django_application = get_asgi_application()

from webapp.agent_asgi import AgentFront  # noqa: E402 - needs Django set up first

application = AgentFront(django_application)
