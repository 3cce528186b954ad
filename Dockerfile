# One image for every Python service of InTune: web, worker, beat and the demo agent.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    INTUNE_VAR_DIR=/var/lib/intune INTUNE_STATIC_ROOT=/app/staticfiles
WORKDIR /app

# torch is pinned to the CPU build; install it first so the layer is cached across code changes.
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY agents ./agents
COPY tuner ./tuner
COPY webapp ./webapp
COPY static ./static
COPY manage.py ./
# The control plane and the tuner (server), and the DLRM workload for the demo agent (dlrm).
RUN pip install --no-cache-dir ".[server,dlrm]" && mkdir -p /var/lib/intune \
    && DJANGO_SECRET_KEY=build python manage.py collectstatic --noinput

EXPOSE 8000
CMD ["gunicorn", "-c", "webapp/gunicorn_conf.py", "webapp.wsgi:application"]
