"""A JSON object with a key given twice is refused with a 400 naming the key, on the agents'
batches (the lean path hands such a body to Django's parser, which refuses it) and the people's
API. Before, the parsers kept one of the values without a word: ``{"samples": [...],
"samples": []}`` was a 200 that stored nothing."""

import json

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webapp.parsers import keys_may_repeat

KEYS = st.sampled_from(["a", "b", "samples", ":", 'q"uote', "t\u00e9", "sp ace", "x:y"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**53), 2**53)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["", ":", "a:b", '"', "\\", "\u00e9", " : "])
)


def _pairs(inner):
    return st.lists(st.tuples(KEYS, inner), max_size=4).map(lambda pairs: ("object", pairs))


VALUES = st.recursive(
    SCALARS, lambda inner: _pairs(inner) | st.lists(inner, max_size=3), max_leaves=12
)


def text(value, separators, ensure_ascii) -> tuple[str, bool]:
    """The JSON text of ``value`` (objects as pair lists, keys possibly repeated) and whether a
    key is repeated in one of its objects."""
    if isinstance(value, tuple) and value[0] == "object":
        parts, repeated = [], False
        keys = [k for k, _ in value[1]]
        repeated = len(set(keys)) != len(keys)
        for key, inner in value[1]:
            inner_text, inner_repeated = text(inner, separators, ensure_ascii)
            repeated |= inner_repeated
            key_text = json.dumps(key, ensure_ascii=ensure_ascii)
            parts.append(f"{key_text}{separators[1]}{inner_text}")
        return "{" + separators[0].join(parts) + "}", repeated
    if isinstance(value, list):
        texts = [text(v, separators, ensure_ascii) for v in value]
        return "[" + separators[0].join(t for t, _ in texts) + "]", any(r for _, r in texts)
    return json.dumps(value, ensure_ascii=ensure_ascii), False


@settings(max_examples=500, deadline=None)
@given(
    value=_pairs(VALUES),
    separators=st.sampled_from([(",", ":"), (", ", ": "), (" ,\n", " :\t")]),
    ensure_ascii=st.booleans(),
)
def test_the_lean_paths_check_never_misses_a_repeated_key(value, separators, ensure_ascii):
    body, repeated = text(value, separators, ensure_ascii)
    body = body.encode()
    may_repeat = keys_may_repeat(body, orjson.dumps(orjson.loads(body)))
    if repeated:
        assert may_repeat, body
    elif b"\\" not in body:
        assert not may_repeat, body  # the usual body stays on the lean path


@pytest.mark.django_db
def test_a_batch_with_a_key_given_twice_is_refused_naming_it(api, job_and_host, sample):
    job, host, token = job_and_host
    good = json.dumps({"samples": [sample(1, job.stage_names)]})
    body = good[:-1] + ', "samples": []}'
    response = api.post(
        f"/api/v1/hosts/{host.pk}/metrics/",
        data=body,
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Agent {token}",
    )
    assert response.status_code == 400
    assert "'samples' appears twice" in response.json()["detail"]
    assert not host.samples.exists()


@pytest.mark.django_db
def test_a_job_with_a_key_given_twice_is_refused_naming_it(api, operator):
    body = '{"name": "a", "name": "b", "stages": [{"name": "read"}], "tuner": "static"}'
    response = api.as_user(operator).post(
        "/api/v1/jobs/", data=body, content_type="application/json"
    )
    assert response.status_code == 400 and "'name' appears twice" in response.json()["detail"]
