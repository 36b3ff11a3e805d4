"""The architecture plan: one typed, frozen description of a model, built once from
a validated spec, that every stage reads instead of deriving its own.

    from onboard.arch import build_plan

    plan = build_plan(spec)
    plan.layers[3].mlp            # MoEMLP(...) or DenseMLP(...)
    plan.layers[3].mixer.window   # sliding window of layer 3, None: full attention
    plan.tensors.checkpoint_name("q_proj", layer=3)

See docs/architecture.md, "The architecture plan".
"""

from onboard.arch.plan import (
    ArchPlan,
    Attention,
    DenseMLP,
    GatedDeltaNet,
    KimiDeltaAttention,
    Layer,
    Mixer,
    MLADims,
    MoEMLP,
    MTPPlan,
    Norms,
    Rotary,
    Router,
    TensorNames,
    build_plan,
)

__all__ = [
    "ArchPlan",
    "Attention",
    "DenseMLP",
    "GatedDeltaNet",
    "KimiDeltaAttention",
    "Layer",
    "MLADims",
    "Mixer",
    "MTPPlan",
    "MoEMLP",
    "Norms",
    "Rotary",
    "Router",
    "TensorNames",
    "build_plan",
]
