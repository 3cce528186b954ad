"""Registering and managing jobs through the REST API."""

from webapp.jobs.models import AuditEntry, Job


def test_an_operator_registers_a_job_with_its_stages(api, operator):
    response = api.as_user(operator).post(
        "/api/v1/jobs/",
        {
            "name": "criteo",
            "description": "DLRM on Criteo",
            "stages": [{"name": "read", "max_workers": 4}, {"name": "parse"}],
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    job = Job.objects.get(name="criteo")
    assert job.stage_names == ["read", "parse"]
    assert job.stages.get(name="read").max_workers == 4
    assert response.json()["tuner"] == "intune"
    assert AuditEntry.objects.filter(action="job.create", job=job, actor=operator).exists()


def test_a_fused_stage_is_registered_under_its_joined_name(api, operator):
    response = api.as_user(operator).post(
        "/api/v1/jobs/",
        {"name": "fused", "stages": [{"name": "read+parse+transform"}, {"name": "prefetch"}]},
        format="json",
    )
    assert response.status_code == 201, response.content
    assert Job.objects.get(name="fused").stage_names == ["read+parse+transform", "prefetch"]


def test_a_stage_name_with_other_punctuation_is_refused(api, operator):
    response = api.as_user(operator).post(
        "/api/v1/jobs/", {"name": "odd", "stages": [{"name": "read parse"}]}, format="json"
    )
    assert response.status_code == 400
    assert "'+' (which joins fused stages)" in response.content.decode()
    assert not Job.objects.filter(name="odd").exists()


def test_a_job_name_is_unique(api, operator, make_job):
    make_job(name="taken")
    response = api.as_user(operator).post(
        "/api/v1/jobs/", {"name": "taken", "stages": [{"name": "read"}]}, format="json"
    )
    assert response.status_code == 400
    assert "already exists" in response.json()["detail"]


def test_duplicate_stage_names_are_refused(api, operator):
    response = api.as_user(operator).post(
        "/api/v1/jobs/",
        {"name": "dup", "stages": [{"name": "read"}, {"name": "read"}]},
        format="json",
    )
    assert response.status_code == 400
    assert "unique" in response.json()["detail"]
    assert not Job.objects.filter(name="dup").exists()


def test_an_unknown_tuner_is_refused_with_the_choices(api, operator):
    response = api.as_user(operator).post(
        "/api/v1/jobs/",
        {"name": "x", "stages": [{"name": "read"}], "tuner": "magic"},
        format="json",
    )
    assert response.status_code == 400
    assert "intune" in response.json()["detail"]


def test_patch_changes_settings_and_delete_removes_the_job(api, operator, make_job):
    job = make_job()
    client = api.as_user(operator)
    response = client.patch(f"/api/v1/jobs/{job.pk}/", {"decision_interval_s": 2.5}, format="json")
    assert response.status_code == 200, response.content
    job.refresh_from_db()
    assert job.decision_interval_s == 2.5
    assert client.delete(f"/api/v1/jobs/{job.pk}/").status_code == 204
    assert not Job.objects.filter(pk=job.pk).exists()


def test_the_stages_of_a_job_with_hosts_cannot_be_renamed(api, operator, job_and_host):
    job, _, _ = job_and_host
    response = api.as_user(operator).patch(
        f"/api/v1/jobs/{job.pk}/", {"stages": [{"name": "other"}]}, format="json"
    )
    assert response.status_code == 400
    assert job.stage_names[0] == "read"


def test_a_nul_character_in_tuning_options_is_refused_on_every_database(api, operator, make_job):
    job = make_job()
    response = api.as_user(operator).patch(
        f"/api/v1/jobs/{job.pk}/", {"tuning_options": {"note": "a\u0000b"}}, format="json"
    )
    assert response.status_code == 400
    assert "NUL" in response.json()["detail"]
    job.refresh_from_db()
    assert job.tuning_options == {}


def test_tuning_options_the_tuner_does_not_take_are_refused_at_registration(api, operator):
    response = api.as_user(operator).post(
        "/api/v1/jobs/",
        {
            "name": "bad-options",
            "stages": [{"name": "read"}, {"name": "parse"}],
            "tuning_options": {"warp_speed": 9},
        },
        format="json",
    )
    assert response.status_code == 400
    assert "warp_speed" in response.json()["detail"]


def test_known_tuning_options_are_kept(api, operator):
    response = api.as_user(operator).post(
        "/api/v1/jobs/",
        {
            "name": "good-options",
            "stages": [{"name": "read"}, {"name": "parse"}],
            "tuning_options": {"online_epsilon": 0.05, "pretrain_steps": 50},
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    assert response.json()["tuning_options"] == {"online_epsilon": 0.05, "pretrain_steps": 50}


def test_a_patch_with_a_stage_without_a_name_is_refused_and_changes_nothing(
    api, operator, make_job
):
    # Found by schemathesis's coverage phase: it was a 500 (the partial update skipped the
    # stage's required name, then the stage checks read it).
    job = make_job(name="kept", stages=["read", "parse"])
    body = {"name": "0", "description": "", "tuner": "intune", "decision_interval_s": 5.0,
            "stages": [{"max_workers": 1, "memory_mb_per_worker": 0.0}], "tuning_options": {}}  # fmt: skip
    response = api.as_user(operator).patch(f"/api/v1/jobs/{job.pk}/", body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["detail"].startswith("stages.0.name: every stage needs a name")
    job.refresh_from_db()
    assert job.name == "kept" and job.stage_names == ["read", "parse"]


def post_job(api, operator, name: str, **fields):
    body = {"name": name, "stages": [{"name": "read"}, {"name": "parse"}]} | fields
    return api.as_user(operator).post("/api/v1/jobs/", body, format="json")


def test_tuning_options_of_the_wrong_type_or_out_of_range_are_refused_naming_each(api, operator):
    options = {"online_epsilon": "high", "gamma": 1.5, "online_batch_size": 0, "tau": 0.0}
    response = post_job(api, operator, "bad-values", tuning_options=options)
    assert response.status_code == 400
    errors = response.json()["errors"]["tuning_options"]
    assert set(errors) == set(options), errors
    assert "must be a number" in str(errors["online_epsilon"])
    assert "above 0" in str(errors["tau"]), "tau's lowest value is excluded"
    assert not Job.objects.filter(name="bad-values").exists()


def test_a_client_cannot_name_a_policy_file_or_a_network_width(api, operator):
    for options in ({"policy": "/etc/passwd"}, {"policy": None}, {"hidden": 8}):
        response = post_job(api, operator, "file-reader", tuning_options=options)
        assert response.status_code == 400, (options, response.content)
        assert "no tuner takes this option" in response.json()["detail"]


def test_a_baseline_tuner_takes_only_the_control_planes_own_option(api, operator):
    refused = post_job(api, operator, "lp-1", tuner="lp", tuning_options={"gamma": 0.5})
    assert refused.status_code == 400
    assert "takes no options" in refused.json()["detail"]
    taken = post_job(api, operator, "lp-2", tuner="lp", tuning_options={"pretrain_steps": 10})
    assert taken.status_code == 201, taken.content


def test_a_job_may_choose_the_prior_tuner_which_takes_only_the_control_planes_option(api, operator):
    taken = post_job(api, operator, "prior-1", tuner="prior", tuning_options={"pretrain_steps": 5})
    assert taken.status_code == 201, taken.content
    assert Job.objects.get(name="prior-1").tuner == "prior"
    refused = post_job(api, operator, "prior-2", tuner="prior", tuning_options={"gamma": 0.5})
    assert refused.status_code == 400
    assert "takes no options" in refused.json()["detail"]


def test_a_description_over_ten_thousand_characters_is_refused(api, operator):
    body = {"name": "long", "stages": [{"name": "read"}], "description": "x" * 10_001}
    response = api.as_user(operator).post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400
    assert response.json()["detail"].startswith(
        "description: Ensure this field has no more than 10000"
    )
    assert not Job.objects.filter(name="long").exists()
    body["description"] = "x" * 10_000
    assert api.as_user(operator).post("/api/v1/jobs/", body, format="json").status_code == 201
