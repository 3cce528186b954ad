"""An error a worker raised reaches the loop as its own type, and like any exception it can be
built again from a message: ``raise type(exc)(f"{exc} while ...") from exc``.

Code that adds context to an error does that, and so does torch's ExceptionWrapper (torch's
test_segfault rebuilt ours in its test process so). Ours are ``StageFailed`` as well (the
stage, the worker's traceback), whose constructor wanted four arguments: the rebuild raised
``TypeError: StageFailed.__init__() missing 3 required positional arguments``.
"""

import pickle

import torch.utils.data as tud

from agents.pipeline import StageFailed
from agents.torch import DataLoader


class Custom(Exception):
    pass


KINDS = [KeyError, ValueError, OSError, IndexError, Custom, RuntimeError]


class Raises(tud.Dataset):
    def __len__(self):
        return len(KINDS)

    def __getitem__(self, i):
        raise KINDS[i](f"item {i}")


def test_each_error_is_built_again_from_a_message_and_pickles_as_its_type():
    loader = DataLoader(Raises(), batch_size=None, num_workers=2)
    caught = []
    try:
        it = iter(loader)
        for _ in KINDS:
            try:
                next(it)
            except Exception as exc:  # noqa: BLE001 - what the loop gets, whatever it is
                caught.append(exc)
    finally:
        loader.close()
    assert [type(exc) for exc in caught] != [] and len(caught) == len(KINDS)
    for kind, exc in zip(KINDS, caught, strict=True):
        assert isinstance(exc, kind) and isinstance(exc, StageFailed)
        again = type(exc)(f"{exc} while reading the validation set")
        assert isinstance(again, kind) and isinstance(again, StageFailed)
        assert str(again).endswith("while reading the validation set")
        copied = pickle.loads(pickle.dumps(again))
        assert isinstance(copied, kind) and str(copied) == str(again)
    plain = StageFailed("a message alone")
    assert str(plain) == "a message alone" and plain.args == ("a message alone",)
    assert pickle.loads(pickle.dumps(plain)).args == ("a message alone",)
