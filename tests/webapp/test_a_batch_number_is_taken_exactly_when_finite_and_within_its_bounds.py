"""A number in a batch is taken, as a float, exactly when it is an int or a float (not a bool),
finite, and within its bounds; anything else is refused with a BatchError naming its place.
Generated values against the rule stated plainly, since the validator takes the usual value by a
shortcut before its detailed checks (webapp/ingestion/validation.py)."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from webapp.ingestion.validation import BatchError, _number

values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.none(),
    st.text(max_size=3),
)
bounds = st.one_of(st.none(), st.floats(min_value=-1e12, max_value=1e12))


# No deadline: a pure function, timed on a machine that other work may load.
@settings(deadline=None)
@given(value=values, low=bounds, high=bounds)
def test_a_batch_number_is_taken_exactly_when_finite_and_within_its_bounds(value, low, high):
    taken = (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and (low is None or value >= low)
        and (high is None or value <= high)
    )
    if taken:
        result = _number(value, "samples[0].stages[1]", "rss_mb", low=low, high=high)
        assert type(result) is float and result == float(value)
    else:
        with pytest.raises(BatchError, match=r"^samples\[0\]\.stages\[1\]\.rss_mb: must be"):
            _number(value, "samples[0].stages[1]", "rss_mb", low=low, high=high)
