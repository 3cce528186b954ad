"""``python -m benchmarks.dashboard``: see ``benchmarks.dashboard.bench``.

INTUNE_SECURE_COOKIES=False .venv/bin/python -m benchmarks.dashboard --hours 24 --stages 8
"""

import os
import sys

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup()

from benchmarks.dashboard.bench import main  # noqa: E402 - needs Django set up

if __name__ == "__main__":
    sys.exit(main())
