"""The dashboard benchmark fills a throwaway job, times every request of the page, cleans up."""

import pytest

from benchmarks.dashboard.bench import main
from webapp.jobs.models import Job


def test_the_benchmark_times_every_request_and_deletes_its_job(db, capsys):
    main(["--hours", "0.02", "--stages", "8", "--repeat", "1"])
    table = capsys.readouterr().out
    for request in [
        "page HTML",
        "metrics, whole range",
        "overview",
        "decisions (500)",
        "first load",
    ]:
        assert request in table
    assert not Job.objects.exists()


def test_the_benchmark_refuses_more_stages_than_it_knows(db):
    with pytest.raises(SystemExit, match="--stages must be between 1 and 8"):
        main(["--hours", "0.01", "--stages", "9"])
