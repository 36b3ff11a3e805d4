"""`onboard new-model`: every stage in order, into the layout of docs/architecture.md.

Each stage reads the spec and files on disk and writes files on disk. A stage is
skipped on a rerun when the fingerprint of its inputs (the resolved spec, the
outputs of the stages it reads, the onboard version) is the one recorded in
``DIR/.onboard/<stage>.json`` and its outputs still exist.
"""

from onboard.pipeline.runner import STAGES, Stage, run_pipeline

__all__ = ["STAGES", "Stage", "run_pipeline"]
