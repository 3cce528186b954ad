"""The DLRM workload: Criteo-format data, its ingestion stages, and a torch DLRM trainer.

from agents.dlrm import build_pipeline
from agents.dlrm.trainer import Trainer, ModelConfig

pipeline = build_pipeline(batch_size=4096).start()
trainer = Trainer(ModelConfig())
trainer.run(pipeline, stop_event)     # in a thread; trainer.stats() from another

``STAGE_NAMES`` needs nothing but this package; ``build_pipeline`` and ``ensure_dataset`` import
torch (the ``dlrm`` extra) when first used, so the control plane can read the stage names cheaply.
"""

from typing import Any

from agents.dlrm.schema import STAGE_NAMES

__all__ = ["STAGE_NAMES", "build_pipeline", "ensure_dataset"]


def __getattr__(name: str) -> Any:
    if name in ("build_pipeline", "ensure_dataset"):
        from agents.dlrm import workload

        return getattr(workload, name)
    raise AttributeError(f"module 'agents.dlrm' has no attribute {name!r}")
