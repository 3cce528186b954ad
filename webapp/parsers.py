"""Request parsing that refuses hostile bodies with a 4xx instead of failing with a 500."""

import json
import re
import sys

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
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


# An escape of a UTF-16 surrogate (``\\ud800`` to ``\\udfff``): the only way a lone surrogate, which
# no UTF-8 text can hold, gets into what ``json`` reads from a body decoded as UTF-8.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def lone_surrogate(data) -> str | None:
    """The first lone surrogate in ``data`` (what ``json`` read), as its escape; None when none.

    ``json`` reads ``"\\ud800"`` as a one-character string that is not text: PostgreSQL's driver
    cannot encode it, and a refusal reason holding one answered ``500`` (a stage name or a
    device was refused only by luck, further on)."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"\\u{ord(exc.object[exc.start]):04x}"
    return None


class SafeJSONParser(JSONParser):
    """DRF's strict JSON parser (NaN and infinities refused), plus: the body is read as UTF-8
    whatever the Content-Type's charset says; bodies nested too deeply for Python's parser are
    a ParseError, not a RecursionError; an object with a key given twice is a ParseError naming
    the key (``unique_keys``); so is a string holding a lone surrogate (``lone_surrogate``).

    UTF-8 always (RFC 8259 8.1: JSON between systems is UTF-8, and ``application/json`` has no
    charset parameter; "adding one really has no effect on compliant recipients"). DRF decoded
    by the charset: a UTF-8 body labelled ``charset=latin-1`` (as some HTTP libraries label
    every text body) stored its refusal reason's "é" as "Ã©", and a UTF-16 body was stored
    where docs/agent-protocol.md says a body is UTF-8. The lean batch path reads only UTF-8
    (webapp/ingestion/api/lean.py), so the two paths now read a body alike."""

    def parse(self, stream, media_type=None, parser_context=None):
        raw = stream.read() if stream is not None else b""
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            charset = (parser_context or {}).get("encoding") or "utf-8"
            said = (
                ""
                if charset.lower().replace("_", "-") in ("utf-8", "utf8")
                else f" (its Content-Type says charset={charset[:40]}, which is not read)"
            )
            raise ParseError(
                f"JSON parse error - the body is not UTF-8{said}: {exc.reason} at byte "
                f"{exc.start}; send JSON as UTF-8 (RFC 8259)"
            ) from exc
        try:
            data = json.loads(text, parse_constant=strict_constant, object_pairs_hook=unique_keys)
        except RecursionError as exc:
            raise ParseError("JSON parse error - the body is nested too deeply") from exc
        except ValueError as exc:
            if "int_max_str_digits" in str(exc):
                # Python's words ("use sys.set_int_max_str_digits() to increase the limit")
                # are advice to the server's developer, not to the client that sent it.
                raise ParseError(
                    f"JSON parse error - an integer has more than {sys.get_int_max_str_digits()} "
                    "digits: no field takes one that long"
                ) from exc
            raise ParseError(f"JSON parse error - {exc}") from exc
        if _SURROGATE_ESCAPE.search(text):
            found = lone_surrogate(data)
            if found is not None:
                raise ParseError(
                    f"JSON parse error - a string holds {found}, half of a UTF-16 surrogate "
                    "pair without its other half, which is not a character: send text as UTF-8"
                )
        return data


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
