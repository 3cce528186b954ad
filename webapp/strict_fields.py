"""Serializer fields that refuse a value of the wrong JSON type instead of converting it.

DRF's fields are lenient: ``"description": 17`` becomes the string "17", ``"cpus": "8"`` the
number 8 and ``"max_steps": 5.0`` the integer 5. A control plane that changes a fleet's CPUs
takes only what its schema says, so a client's type error is a 400 that names the field.
"""

from django.core.exceptions import ValidationError
from django.core.validators import RegexValidator
from django.db import models
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


class StrictModelSerializer(serializers.ModelSerializer):
    """A ModelSerializer whose fields built from the model are the strict ones."""

    serializer_field_mapping = serializers.ModelSerializer.serializer_field_mapping | {
        models.CharField: StrictCharField,
        models.TextField: StrictCharField,
        models.IntegerField: StrictIntegerField,
        models.PositiveIntegerField: StrictIntegerField,
        models.PositiveSmallIntegerField: StrictIntegerField,
        models.BigIntegerField: StrictIntegerField,
        models.FloatField: StrictFloatField,
    }


class FullMatch(RegexValidator):
    """A regex the whole value must match (``re.fullmatch``: a trailing newline does not slip
    past ``$``). drf-spectacular writes its pattern into the schema as ``pattern``, so write
    it anchored and in the syntax both Python and JSON Schema (ECMA 262) read alike."""

    def __call__(self, value):
        if not isinstance(value, str) or not self.regex.fullmatch(value):
            raise ValidationError(self.message, code=self.code)
