"""A tensor a worker sends comes back laid out as it was sent, as torch's workers send a
tensor (its storage and its strides): a batch of ``channels_last`` images stays
``channels_last``, a sample ``permute``d from HWC to CHW keeps its strides, and an
``expand``ed tensor stays a view of its few elements. Before, every tensor was made
contiguous on the way (other kernels in the model than under torch, and an expanded mask as
large as its expansion). A strided slice, whose memory holds other elements between its
own, still travels as its own elements only (torch sends the whole storage)."""

from __future__ import annotations

import pickle

import torch
import torch.utils.data as tud
from hypothesis import given, settings
from hypothesis import strategies as st

from agents.pipeline import shm
from agents.torch import DataLoader


@st.composite
def laid_out(draw) -> torch.Tensor:
    """A tensor of 1 to 4 dimensions, permuted and with some of its size-1 dims expanded."""
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    tensor = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
    tensor = tensor.permute(draw(st.permutations(range(len(shape)))))
    expanded = [draw(st.integers(1, 3)) if size == 1 else size for size in tensor.shape]
    return tensor.expand(expanded)


def strides(tensor: torch.Tensor) -> list[int]:
    """The strides that place elements (a dimension of size 1 may have any)."""
    return [stride for size, stride in zip(tensor.shape, tensor.stride(), strict=True) if size > 1]


@settings(max_examples=60, deadline=None)
@given(laid_out())
def test_shared_memory_and_the_pipe_give_a_tensor_back_with_its_strides(tensor):
    for back in (
        shm.unpack(shm.pack({"x": tensor}, "intune-test", min_bytes=1))["x"],
        pickle.loads(shm.dumps(tensor)),
    ):
        assert torch.equal(back, tensor)
        assert strides(back) == strides(tensor)
        # The memory sent is the tensor's own, not its expansion.
        assert back.untyped_storage().nbytes() <= tensor.numel() * tensor.element_size()


class Images(tud.Dataset):
    """HWC images turned to CHW by ``permute``, an expanded mask, a strided slice."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int):
        image = (torch.arange(24.0).reshape(2, 3, 4) + i).permute(2, 0, 1)
        return image, torch.tensor([1.0]).expand(1000), torch.arange(12.0).reshape(3, 4)[:, ::2]


def layouts(loader) -> list[tuple]:
    return [
        (
            image.stride(),
            image.is_contiguous(memory_format=torch.channels_last) if image.dim() == 4 else None,
            mask.stride(),
            image.sum().item(),
        )  # fmt: skip
        for image, mask, _ in loader
    ]


def test_a_loaders_samples_and_batches_keep_torchs_strides():
    for batch_size in (None, 3):
        ours = DataLoader(Images(), batch_size=batch_size, num_workers=2)
        try:
            got = layouts(ours)
        finally:
            ours.close()
        assert got == layouts(tud.DataLoader(Images(), batch_size=batch_size, num_workers=2))
    # Samples cut from a channels_last batch, stacked by default_collate as torch stacks them.
    images = list(torch.rand(4, 3, 4, 4).contiguous(memory_format=torch.channels_last))
    ours = DataLoader(images, batch_size=2, num_workers=2)
    try:
        assert [b.stride() for b in ours] == [
            b.stride() for b in tud.DataLoader(images, batch_size=2, num_workers=2)
        ]
    finally:
        ours.close()
