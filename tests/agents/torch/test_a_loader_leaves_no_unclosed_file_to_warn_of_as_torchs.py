"""torch's DataLoader leaves nothing for ``ResourceWarning`` to report: a training script's
test suite run with warnings as errors (``python -X dev``, pytest's ``-W error``) passes with
it. Ours warned "unclosed file" twice per epoch: the file under each of a pipeline's
``agents.process_lock.ProcessLock`` (the count of workers, the table of workers in
``worker_init_fn``) was left to the garbage collector, open."""

import gc
import warnings

from agents.torch import DataLoader
from tests.agents.torch.conftest import Counting


def test_epochs_of_every_kind_of_loader_leave_no_unclosed_file():
    gc.collect()  # what earlier tests left is not this test's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        for dataset in (list(range(9)), Counting(9)):
            for num_workers, persistent in ((0, False), (2, False), (2, True)):
                loader = DataLoader(dataset, batch_size=2, num_workers=num_workers,
                                    persistent_workers=persistent,
                                    worker_init_fn=lambda worker_id: None)  # fmt: skip
                try:
                    for _ in range(2):
                        list(loader)
                    for _ in loader:
                        break
                finally:
                    loader.close()
                del loader
                gc.collect()
    assert [str(w.message) for w in caught if w.category is ResourceWarning] == []
