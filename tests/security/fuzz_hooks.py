"""schemathesis hooks for the coverage phase (loaded by name through SCHEMATHESIS_HOOKS).

Job names and a job's host names are unique, so the second case that reuses a generated name
("0", "A") is refused as a duplicate: a 400 by design, which would hide what the case tests.
Every *valid* name a case sends is made unique (it stays valid); an invalid one is left as it
is, so that a case meant to be refused for its name still is.
"""

import itertools
import re
import secrets

import schemathesis

from webapp.jobs.names import HOST_NAME, NOT_BLANK_TEXT

NAMED = {
    ("POST", "/api/v1/jobs/"): (re.compile(NOT_BLANK_TEXT), 100),
    ("PATCH", "/api/v1/jobs/{id}/"): (re.compile(NOT_BLANK_TEXT), 100),
    ("POST", "/api/v1/jobs/{job_id}/hosts/"): (re.compile(HOST_NAME), 64),
}
_counter = itertools.count(1)
_RUN = secrets.token_hex(3)  # so that several runs against one server never collide


@schemathesis.hook
def before_call(context, case, kwargs):
    rule = NAMED.get((case.operation.method.upper(), case.operation.path))
    body = case.body
    if rule is None or not isinstance(body, dict) or not isinstance(body.get("name"), str):
        return
    pattern, max_length = rule
    name = body["name"]
    if len(name) <= max_length and pattern.fullmatch(name):
        suffix = f"-{_RUN}-{next(_counter)}"
        body["name"] = name[: max_length - len(suffix)] + suffix
