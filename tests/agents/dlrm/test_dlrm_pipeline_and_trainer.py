"""The DLRM pipeline delivers the dataset's batches; the trainer learns and measures waiting."""

import threading
import time

import pytest
import torch

from agents.dlrm import STAGE_NAMES, build_pipeline
from agents.dlrm.generate import load_index
from agents.dlrm.stages import Transform, chunk_tasks, collate, parse, read
from agents.dlrm.trainer import ModelConfig, Trainer
from agents.pipeline import Pipeline, Stage
from agents.pipeline.examples import Work

TABLES = [1000] * 26
SMALL = ModelConfig(TABLES, embedding_dim=8, bottom_mlp=(16,), top_mlp=(16,))


def test_one_epoch_delivers_every_batch_in_order_through_a_resize(dataset):
    expected = [
        collate(Transform()(parse(read(t)))) for t in chunk_tasks(dataset, load_index(dataset))
    ]
    pipeline = build_pipeline(dataset, batch_size=512, epochs=2)
    assert pipeline.stage_names == STAGE_NAMES
    with pipeline:
        got = []
        for batch in pipeline:
            got.append(batch)
            if len(got) == 3:
                pipeline.apply({"parse": 2, "transform": 2, "read": 2})
    assert len(got) == 2 * len(expected)
    for mine, theirs in zip(got, expected + expected, strict=True):
        assert torch.equal(mine["dense"], theirs["dense"])
        assert all(
            torch.equal(a, b)
            for a, b in zip(mine["sparse_values"], theirs["sparse_values"], strict=True)
        )


def test_the_trainer_learns_on_the_pipelines_batches(dataset):
    trainer = Trainer(SMALL, device="cpu")
    with build_pipeline(dataset, batch_size=512, table_sizes=TABLES) as pipeline:
        first = [trainer.step(b) for b, _ in zip(pipeline, range(3), strict=False)]
        trainer.run(pipeline, max_steps=40)
    assert trainer.last_loss < sum(first) / 3
    assert trainer.stats()["device"] == "cpu"


def _premade_batches(dataset):
    batches = [
        collate(Transform(TABLES)(parse(read(t))))
        for t in chunk_tasks(dataset, load_index(dataset))
    ]

    def endless():
        while True:
            yield from range(len(batches))

    return batches, endless


def _idle_with(dataset, fetchers: int) -> dict:
    # The input "fetch" sleeps 100 ms per batch, as a read from slow storage would: starving
    # the trainer does not depend on how busy the machine's cores are.
    batches, endless = _premade_batches(dataset)
    stage = Stage("fetch", Work(ms=100), workers=fetchers, kind="thread", max_workers=32)
    pipeline = Pipeline(
        endless, [stage, Stage("lookup", lambda i: batches[i - 1], kind="thread")], queue_size=32
    )
    trainer = Trainer(SMALL, device="cpu")
    stop = threading.Event()
    with pipeline:
        runner = threading.Thread(target=trainer.run, args=(pipeline, stop))
        runner.start()
        time.sleep(0.5)
        trainer.stats()
        time.sleep(1.5)
        stats = trainer.stats()
        stop.set()
        runner.join(timeout=30)
        assert not runner.is_alive(), "the trainer did not stop when asked"
    return stats


def test_trainer_idle_rises_when_the_pipeline_is_starved_and_falls_when_it_is_not(dataset):
    starved = _idle_with(dataset, fetchers=1)
    fed = _idle_with(dataset, fetchers=30)
    assert starved["idle_fraction"] > 0.5
    assert fed["idle_fraction"] < starved["idle_fraction"] / 2
    assert starved["wait_ms"] > fed["wait_ms"]
    assert fed["throughput"] > starved["throughput"]


def test_a_fused_dlrm_pipeline_delivers_the_same_batches_as_the_staged_one(dataset):
    with build_pipeline(dataset, batch_size=512, epochs=1) as staged:
        expected = list(staged)
    fused = build_pipeline(
        dataset,
        batch_size=512,
        epochs=1,
        fuse="read+parse+transform+collate",
        workers={"read+parse+transform+collate": 2},
    )
    assert fused.stage_names == ["read+parse+transform+collate", "prefetch"]
    with fused:
        got = list(fused)
    assert len(got) == len(expected)
    for mine, theirs in zip(got, expected, strict=True):
        assert torch.equal(mine["dense"], theirs["dense"])
        assert torch.equal(mine["labels"], theirs["labels"])
        assert all(
            torch.equal(a, b)
            for a, b in zip(mine["sparse_values"], theirs["sparse_values"], strict=True)
        )


def test_workers_for_a_stage_fused_away_are_refused_with_the_stages_there_are(dataset):
    with pytest.raises(ValueError, match=r"unknown stage\(s\) \['parse'\].*'read\+parse'"):
        build_pipeline(dataset, batch_size=512, fuse="read+parse", workers={"parse": 2})
