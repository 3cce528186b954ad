"""A PATCH of a job that another request deleted after this one read it answers 404 and leaves
the job deleted. Before, save() found no row to UPDATE and INSERTed the job again, without its
stages (the fuzz tests' stateful phase, two workers: a PATCH and a DELETE of one job)."""

import pytest
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from webapp.jobs.api.serializers import JobSerializer
from webapp.jobs.api.views import JobViewSet
from webapp.jobs.models import Job


def test_a_patch_of_a_job_deleted_meanwhile_is_refused_and_does_not_recreate_it(make_job, operator):
    job = make_job()
    read_by_the_patch = Job.objects.get(pk=job.pk)  # the PATCH has read it ...
    request = Request(APIRequestFactory().patch(f"/api/v1/jobs/{job.pk}/", {"description": "x"}))
    request.user = operator
    view = JobViewSet(request=request, format_kwarg=None, action="partial_update", kwargs={})
    serializer = JobSerializer(
        read_by_the_patch,
        data={"description": "x"},
        partial=True,
        context={"request": request},
    )
    assert serializer.is_valid(), serializer.errors  # ... and checked it
    Job.objects.filter(pk=job.pk).delete()  # when another request's DELETE commits
    with pytest.raises(NotFound):
        view.perform_update(serializer)
    assert not Job.objects.filter(pk=job.pk).exists()


def test_a_patch_of_a_live_job_still_changes_it(api, operator, make_job):
    job = make_job()
    answer = api.as_user(operator).patch(
        f"/api/v1/jobs/{job.pk}/", {"description": "new words"}, format="json"
    )
    assert answer.status_code == 200, answer.content
    assert Job.objects.get(pk=job.pk).description == "new words"
    assert answer.json()["stages"], "its stages are kept"
