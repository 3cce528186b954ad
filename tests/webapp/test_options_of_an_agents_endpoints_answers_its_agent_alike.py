"""``OPTIONS`` of the two endpoints an agent uses answers its token the same way.

An outside client asked both with its agent token: the allocation endpoint described itself
(200) and the batch endpoint, which is also the people's series view, answered 401. Both now
take the host's own agent token and a signed-in person, and refuse another host's token.
"""

import pytest


@pytest.mark.parametrize("endpoint", ["metrics", "allocation"])
def test_the_hosts_agent_and_its_operator_get_a_description_and_another_host_does_not(
    api, job_and_host, make_host, operator, endpoint
):
    job, host, token = job_and_host
    other, other_token = make_host(job)
    url = f"/api/v1/hosts/{host.pk}/{endpoint}/"

    own = api.as_agent(token).options(url)
    assert own.status_code == 200, own.content
    assert own.json()["name"]
    assert "POST" in own["Allow"] or "GET" in own["Allow"]

    assert api.as_agent(other_token).options(url).status_code == 403

    api.credentials()
    assert api.options(url).status_code == 401

    if endpoint == "metrics":  # the people's view: an operator may ask it too
        assert api.as_user(operator).options(url).status_code == 200
