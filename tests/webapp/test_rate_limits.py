"""Rate limits on login and on agents' endpoints answer 429 with Retry-After."""

import pytest
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle


@pytest.fixture
def throttle_rates(monkeypatch):
    """``throttle_rates(login="3/min")`` sets the throttles' rates for this test only: DRF reads
    them from a class attribute, which monkeypatch puts back, so no later test inherits them."""

    def set_rates(**rates: str) -> None:
        monkeypatch.setattr(
            SimpleRateThrottle, "THROTTLE_RATES", {**api_settings.DEFAULT_THROTTLE_RATES, **rates}
        )

    return set_rates


def test_login_attempts_are_rate_limited_per_address(api, operator, throttle_rates):
    throttle_rates(login="3/min")
    codes = [
        api.post(
            "/api/v1/auth/token/", {"username": "olivia", "password": "wrong"}, format="json"
        ).status_code
        for _ in range(4)
    ]
    assert codes == [400, 400, 400, 429]
    blocked = api.post(
        "/api/v1/auth/token/",
        {"username": "olivia", "password": "pw-for-tests-only"},
        format="json",
    )
    assert blocked.status_code == 429 and "Retry-After" in blocked.headers


def test_each_agent_has_its_own_budget(api, make_job, make_host, sample, throttle_rates):
    job = make_job()
    (host_a, token_a), (host_b, token_b) = make_host(job, name="a"), make_host(job, name="b")
    throttle_rates(agent="2/min")
    client = api.as_agent(token_a)
    codes = [
        client.post(
            f"/api/v1/hosts/{host_a.pk}/metrics/",
            {"samples": [sample(i, job.stage_names)]},
            format="json",
        ).status_code
        for i in range(3)
    ]
    assert codes == [200, 200, 429]
    other = api.as_agent(token_b).post(
        f"/api/v1/hosts/{host_b.pk}/metrics/",
        {"samples": [sample(1, job.stage_names)]},
        format="json",
    )
    assert other.status_code == 200
