"""Tiny helpers that read settings from the environment (after healthchecks' ``hc/settings.py``).

Strict: a value that does not parse stops the process at start with a message that names the
variable and the values it takes. A typo must never turn a setting off
(``INTUNE_SECURE_COOKIES=Ture`` read as False would drop Secure cookies, the HTTPS redirect and
HSTS without a word). An unset or empty variable takes its default.
"""

import math
import os

from django.core.exceptions import ImproperlyConfigured

TRUE = ("true", "1", "yes", "on")
FALSE = ("false", "0", "no", "off")


def _raw(name: str) -> str | None:
    value = os.getenv(name)
    return None if value is None or value.strip() == "" else value.strip()


def envbool(name: str, default: bool) -> bool:
    """The variable as a boolean: one of true/1/yes/on or false/0/no/off, in any case."""
    if not isinstance(default, bool):  # envbool("X", "False") would read as True when unset
        raise TypeError(f"envbool({name!r}, ...): the default must be True or False")
    value = _raw(name)
    if value is None:
        return default
    if value.lower() in TRUE:
        return True
    if value.lower() in FALSE:
        return False
    raise ImproperlyConfigured(
        f"{name}={value!r} is not a boolean: use True or False "
        f"(also accepted: {', '.join(TRUE[1:] + FALSE[1:])}), or unset it for the default "
        f"({default})"
    )


def envint(name: str, default: int) -> int:
    """The variable as a whole number."""
    value = _raw(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise ImproperlyConfigured(
            f"{name}={value!r} is not a whole number: use digits only, e.g. {name}={default}, "
            "or unset it for that default"
        ) from None


def envfloat(name: str, default: float) -> float:
    """The variable as a finite number."""
    value = _raw(name)
    if value is None:
        return default
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise ImproperlyConfigured(
            f"{name}={value!r} is not a finite number: use e.g. {name}={default:g}, "
            "or unset it for that default"
        )
    return number


def envlist(name: str, default: str = "") -> list[str]:
    """The variable as a comma-separated list; blank items are dropped."""
    return [item.strip() for item in os.getenv(name, default).split(",") if item.strip()]
