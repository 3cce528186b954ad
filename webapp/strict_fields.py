"""Serializer fields that refuse a value of the wrong JSON type instead of converting it.

DRF's fields are lenient: ``"description": 17`` becomes the string "17", ``"cpus": "8"`` the
number 8 and ``"max_steps": 5.0`` the integer 5. A control plane that changes a fleet's CPUs
takes only what its schema says, so a client's type error is a 400 that names the field.
"""

from collections.abc import Mapping

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from rest_framework import serializers


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictIntegerField(serializers.IntegerField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictFloatField(serializers.FloatField):
    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int | float):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictDateTimeField(serializers.DateTimeField):
    """An ISO 8601 time that says its UTC offset (``2026-11-25T06:00:00Z``, ``...+02:00``).

    DRF reads a time without one (``2026-11-25T06:00:00``) in the server's time zone (UTC:
    ``USE_TZ``, ``TIME_ZONE``) without a word: an operator in Berlin who typed local time got an
    override that ended an hour late. A time without its offset is ambiguous, so it is a 400
    that names the field. A JSON number or anything else not a string is refused too."""

    default_error_messages = {
        "naive": "{value!r} has no UTC offset: add one, e.g. {value}Z for UTC or {value}+02:00",
    }

    def to_internal_value(self, value):
        if not isinstance(value, str):
            self.fail("invalid", format="an ISO 8601 string with its UTC offset")
        try:
            parsed = parse_datetime(value)
        except ValueError:
            parsed = None  # DRF's own message says what is wrong
        if parsed is not None and timezone.is_naive(parsed):
            self.fail("naive", value=value[:64])
        return super().to_internal_value(value)


class KnownFieldsOnly:
    """A serializer that refuses a field it does not have, naming it and the fields it takes.

    DRF drops them without a word: ``"expire_at"`` for ``"expires_at"`` made an override that
    never expired, ``"cpu"`` for ``"cpus"`` a host with the default. Its read-only fields are
    known (ignored as DRF does), so that what a GET answered can be sent back."""

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            unknown = sorted(str(key) for key in data if key not in self.fields)
            if unknown:
                takes = sorted(name for name, field in self.fields.items() if not field.read_only)
                raise serializers.ValidationError(
                    {
                        key[:64]: [f"unknown field; this takes {', '.join(takes)}"]
                        for key in unknown[:5]
                    }
                )
        return super().to_internal_value(data)


class StrictModelSerializer(KnownFieldsOnly, serializers.ModelSerializer):
    """A ModelSerializer whose fields built from the model are the strict ones, and which
    refuses a field it does not have (``KnownFieldsOnly``)."""

    serializer_field_mapping = serializers.ModelSerializer.serializer_field_mapping | {
        models.CharField: StrictCharField,
        models.TextField: StrictCharField,
        models.IntegerField: StrictIntegerField,
        models.PositiveIntegerField: StrictIntegerField,
        models.PositiveSmallIntegerField: StrictIntegerField,
        models.BigIntegerField: StrictIntegerField,
        models.FloatField: StrictFloatField,
        models.DateTimeField: StrictDateTimeField,
    }


class FullMatch(RegexValidator):
    """A regex the whole value must match (``re.fullmatch``: a trailing newline does not slip
    past ``$``). drf-spectacular writes its pattern into the schema as ``pattern``, so write
    it anchored and in the syntax both Python and JSON Schema (ECMA 262) read alike."""

    def __call__(self, value):
        if not isinstance(value, str) or not self.regex.fullmatch(value):
            raise ValidationError(self.message, code=self.code)
