"""A setting that does not parse stops the process at start, naming the variable and the values
it takes; a typo never turns a setting off."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from webapp.env import envbool, envfloat, envint

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("value", ["True", "true", "TRUE", "1", "yes", "On", " true "])
def test_a_boolean_reads_every_spelling_of_true(monkeypatch, value):
    monkeypatch.setenv("INTUNE_TEST_FLAG", value)
    assert envbool("INTUNE_TEST_FLAG", False) is True


@pytest.mark.parametrize("value", ["False", "false", "0", "no", "OFF"])
def test_a_boolean_reads_every_spelling_of_false(monkeypatch, value):
    monkeypatch.setenv("INTUNE_TEST_FLAG", value)
    assert envbool("INTUNE_TEST_FLAG", True) is False


@pytest.mark.parametrize("value", [None, "", "  "])
def test_an_unset_or_empty_variable_takes_the_default(monkeypatch, value):
    for name in ("INTUNE_TEST_FLAG", "INTUNE_TEST_COUNT", "INTUNE_TEST_SECONDS"):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert envbool("INTUNE_TEST_FLAG", True) is True
    assert envint("INTUNE_TEST_COUNT", 16) == 16
    assert envfloat("INTUNE_TEST_SECONDS", 2.5) == 2.5


@pytest.mark.parametrize("value", ["Ture", "enabled", "2", "y"])
def test_a_boolean_typo_is_refused_with_the_values_it_takes(monkeypatch, value):
    monkeypatch.setenv("INTUNE_SECURE_COOKIES", value)
    with pytest.raises(ImproperlyConfigured) as refused:
        envbool("INTUNE_SECURE_COOKIES", True)
    message = str(refused.value)
    assert f"INTUNE_SECURE_COOKIES={value!r}" in message
    assert "True or False" in message


@pytest.mark.parametrize("value", ["16.5", "sixteen", "1e3", "0x10"])
def test_a_whole_number_that_does_not_parse_is_refused(monkeypatch, value):
    monkeypatch.setenv("INTUNE_DB_POOL_SIZE", value)
    with pytest.raises(ImproperlyConfigured, match=r"INTUNE_DB_POOL_SIZE=.* is not a whole number"):
        envint("INTUNE_DB_POOL_SIZE", 16)


@pytest.mark.parametrize("value", ["3s", "nan", "inf", "-Infinity"])
def test_a_number_that_does_not_parse_or_is_not_finite_is_refused(monkeypatch, value):
    monkeypatch.setenv("INTUNE_DB_POOL_TIMEOUT_S", value)
    with pytest.raises(ImproperlyConfigured, match=r"INTUNE_DB_POOL_TIMEOUT_S=.* is not a finite"):
        envfloat("INTUNE_DB_POOL_TIMEOUT_S", 3.0)


def test_numbers_that_parse_are_read(monkeypatch):
    monkeypatch.setenv("INTUNE_DB_POOL_SIZE", " 32 ")
    monkeypatch.setenv("INTUNE_DB_POOL_TIMEOUT_S", "0.25")
    assert envint("INTUNE_DB_POOL_SIZE", 16) == 32
    assert envfloat("INTUNE_DB_POOL_TIMEOUT_S", 3.0) == 0.25


def test_a_typo_in_a_security_setting_stops_manage_py_at_start(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "INTUNE_"))}
    env |= {
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'typo.sqlite3'}",
        "INTUNE_VAR_DIR": str(tmp_path),
        "INTUNE_SECURE_COOKIES": "Ture",
    }
    result = subprocess.run([sys.executable, "manage.py", "check"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0
    assert "INTUNE_SECURE_COOKIES='Ture' is not a boolean: use True or False" in result.stderr


def test_a_boolean_default_written_as_a_string_is_a_programming_error():
    with pytest.raises(TypeError, match="the default must be True or False"):
        envbool("INTUNE_TEST_FLAG", "False")


def test_a_negative_clock_skew_stops_manage_py_at_start(tmp_path):
    """INTUNE_MAX_CLOCK_SKEW_S below 0 would refuse every sample of every agent."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "INTUNE_"))}
    env |= {
        "DJANGO_SETTINGS_MODULE": "webapp.settings",
        "DATABASE_URL": f"sqlite:///{tmp_path / 'skew.sqlite3'}",
        "INTUNE_VAR_DIR": str(tmp_path),
        "INTUNE_MAX_CLOCK_SKEW_S": "-5",
    }
    result = subprocess.run([sys.executable, "manage.py", "check"], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120)  # fmt: skip
    assert result.returncode != 0
    assert "INTUNE_MAX_CLOCK_SKEW_S=-5 would refuse every sample" in result.stderr
