import numpy as np
import pytest

from agents.dlrm import formats
from agents.dlrm.generate import DatasetSpec, generate


@pytest.fixture(scope="session")
def dataset(tmp_path_factory):
    """A small gzip dataset: 6 chunks of 512 rows in 2 shards."""
    out = tmp_path_factory.mktemp("criteo")
    generate(out, DatasetSpec(rows=6 * 512, rows_per_chunk=512, shards=2, seed=7))
    return out


@pytest.fixture
def own_cache(tmp_path_factory, monkeypatch):
    """A cache folder of the test's own, where raw indexes of URLs and read-only folders go
    (``pytestmark = pytest.mark.usefixtures("own_cache")``)."""
    monkeypatch.setenv("INTUNE_CACHE", str(tmp_path_factory.mktemp("cache")))


def rows_read(location, batch_size: int) -> dict[str, np.ndarray]:
    """Every row of ``location`` read and parsed in this process, in order."""
    chunks, reader, parser = formats.read_and_parse_stages(location, batch_size)
    parsed = [parser(reader(chunk)) for chunk in chunks]
    return {k: np.concatenate([p[k] for p in parsed]) for k in parsed[0]}
