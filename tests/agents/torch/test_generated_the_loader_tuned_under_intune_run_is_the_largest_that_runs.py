"""Which loader ``intune-run`` tunes (``agents.torch.auto._Tuned``), over generated scripts:
loaders of any size built, iterated and dropped in any order (Lightning builds its training
loader after the sanity check has iterated the validation one; accelerate rebuilds the
script's loader, whose original may stay alive and never run).

Whenever the loader tuned has started an iteration, it has the most batches among the live
loaders that have; one that never starts while other loaders start twice gives way; every
move is one attach, in the order of the choices, the last attach naming the loader tuned."""

import math
import weakref

from hypothesis import given, settings
from hypothesis import strategies as st

from agents.torch import auto


class Loader:
    """Stands in for a loader: its length, the rest is not read by the choice."""

    def __init__(self, batches: int | None) -> None:
        self.batches = batches

    def __len__(self) -> int:
        if self.batches is None:
            raise TypeError("an IterableDataset without __len__")
        return self.batches


def size(loader: Loader) -> float:
    return math.inf if loader.batches is None else loader.batches


ops = st.lists(
    st.one_of(
        st.tuples(st.just("build"), st.one_of(st.none(), st.integers(1, 40))),
        st.tuples(st.just("iter"), st.integers(0, 7)),
        st.tuples(st.just("drop"), st.integers(0, 7)),
    ),
    max_size=30,
)


@settings(max_examples=300, deadline=None)
@given(ops)
def test_the_loader_tuned_is_the_largest_that_runs(script):
    tuned = auto._Tuned()
    attaches = []
    tuned._attach = lambda loader, index, generation: attaches.append(
        (weakref.ref(loader), generation)
    )
    held, started, since_choice_untouched = [], [], 0
    before = now = None
    for op, arg in script:
        if op == "build":
            loader = Loader(arg)
            held.append(loader)
            tuned.built(loader)
            continue
        if not held:
            continue
        loader = held[arg % len(held)]
        if op == "drop":
            held.remove(loader)
            started = [x for x in started if x is not loader]
            loader = before = now = None  # the last reference gone: collected at once
            continue
        before = tuned.tuned() if tuned.tuned is not None else None
        tuned.iterating(loader)
        if loader not in started:
            started.append(loader)
        now = tuned.tuned() if tuned.tuned is not None else None
        if now is not None and now in started:
            assert size(now) == max(size(x) for x in started), (size(now), script)
        # A loader tuned that never starts gives way by the second start after its choice.
        if now is before and now is not None and now not in started:
            since_choice_untouched += 1
            assert since_choice_untouched < 2, script
        else:
            since_choice_untouched = 0
    generations = [generation for _, generation in attaches]
    assert generations == list(range(1, len(attaches) + 1))
    if attaches:
        assert tuned.tuned() is attaches[-1][0]()  # the one attached last (or both gone)
