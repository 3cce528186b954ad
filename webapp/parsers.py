"""Request parsing that refuses hostile bodies with a 4xx instead of failing with a 500."""

import codecs
import json

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser, get_encoding
from rest_framework.utils.json import strict_constant


def unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """``object_pairs_hook`` of ``json.load``: the object, or ValueError naming a key given twice.

    JSON parsers keep one of a repeated key's values and drop the others without a word (RFC
    8259 leaves it to them): ``{"samples": [...], "samples": []}`` stored nothing and said 200,
    and a person's ``{"reason": "a", "reason": "b"}`` kept whichever the parser chose."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen = set()
        for key, _ in pairs:
            if key in seen:
                raise ValueError(
                    f"the key {key[:64]!r} appears twice in one object: send each key once"
                )
            seen.add(key)
    return found


def keys_may_repeat(body: bytes, parsed_again: bytes) -> bool:
    """Whether ``body`` may hold an object with a key given twice, by its bytes and
    ``parsed_again`` (``orjson.dumps`` of what orjson, which keeps a repeated key's last value,
    read from it). False only when sure: without an escape in ``body`` (``\\u003a`` is a colon
    once read) the strings of both are the same bytes, so their colons are the same but for one
    after each key orjson dropped (and any in its value). About 20 us a batch of 5 samples x 8
    stages, most of it the dumps (webapp/ingestion/api/lean.py); when True, Django's parser
    (``unique_keys``) decides."""
    return b"\\" in body or body.count(b":") != parsed_again.count(b":")


class SafeJSONParser(JSONParser):
    """DRF's strict JSON parser (NaN and infinities refused), plus: bodies nested too deeply for
    Python's parser are a ParseError, not a RecursionError; an object with a key given twice
    is a ParseError naming the key (``unique_keys``)."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = get_encoding(parser_context or {})
        try:
            return json.load(
                codecs.getreader(encoding)(stream),
                parse_constant=strict_constant,
                object_pairs_hook=unique_keys,
            )
        except RecursionError as exc:
            raise ParseError("JSON parse error - the body is nested too deeply") from exc
        except ValueError as exc:
            raise ParseError(f"JSON parse error - {exc}") from exc


class BodySizeLimitMiddleware:
    """Refuse bodies over INTUNE_MAX_BODY_BYTES with 413 before anything reads them (DRF reads
    the stream itself, around Django's DATA_UPLOAD_MAX_MEMORY_SIZE check)."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        from django.http import JsonResponse

        length = request.META.get("CONTENT_LENGTH") or "0"
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        try:
            too_big = int(length) > limit
        except ValueError:
            return JsonResponse({"detail": "Content-Length must be a number"}, status=400)
        if too_big:
            return JsonResponse(
                {
                    "detail": f"the body is {int(length)} bytes; the limit is {limit} bytes: send smaller batches"
                },
                status=413,
            )
        return self.get_response(request)
