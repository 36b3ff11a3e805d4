"""The dense MLP: ``down_proj(act(gate_proj(x)) * up_proj(x))``, the MLP of every
layer the MoE block leaves dense (all of them in a dense model) and of a dense
MTP block.

This module owns its spec field (``mlp.intermediate_size``) and the rule that
dense layers need it, its plan node, its checkpoint roles (``gate_proj``,
``up_proj``, ``down_proj``, or ``gate_up_proj`` where the checkpoint fuses gate
and up) with their shapes, and its tensors. Its code is the fragments under
``templates/components/dense_mlp/``; the activation is its own component's.

config.json states the width as ``intermediate_size`` (Llama-4:
``intermediate_size_mlp``, its ``intermediate_size`` being the experts'); the
spec reader reads it with the MoE block's keys, which decide whose width
``intermediate_size`` is (Mixtral's experts', where the config has no
``moe_intermediate_size``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import Field

from onboard.components.base import Component, Report, Role, Section, TensorPlan, Width

if TYPE_CHECKING:
    from onboard.arch.plan import Layer
    from onboard.spec.model import ModelSpec


class DenseMLPFields(Section):
    intermediate_size: Width | None = Field(
        None, description="Width of dense MLP layers (required if any layer is dense)."
    )


@dataclass(frozen=True)
class DenseMLP:
    """A dense (gated) MLP block."""

    intermediate_size: int

    kind = "dense"


_LAYER = "model.layers.{layer}"
_WIDTH = "mlp.intermediate_size"


def _role(name: str, *dims: str) -> Role:
    # Column- and row-parallel layers: split over the tensor-parallel ranks.
    return Role(f"{_LAYER}.mlp.{name}", ("mlp",), dims=dims, group="dense MLP")


class _DenseMLP(Component):
    name = "dense_mlp"
    label = "dense MLP"
    host = "mlp"
    extends = "mlp"
    Fields = DenseMLPFields
    Node = None  # a layer's MLP itself (Layer.mlp), not a part of it
    reference_only = False
    config_aliases = {
        "intermediate_size": ("intermediate_size",),
        # Llama-4: the dense layers' width, where intermediate_size is the experts'
        "intermediate_size_mlp": ("intermediate_size_mlp",),
    }
    concept_fields = {
        "intermediate_size": (_WIDTH,),
        "intermediate_size_mlp": (_WIDTH,),
    }
    roles = {
        "gate_proj": _role("gate_proj", _WIDTH, "hidden_size"),
        "up_proj": _role("up_proj", _WIDTH, "hidden_size"),
        "down_proj": _role("down_proj", "hidden_size", _WIDTH),
        # checkpoint.fused: gate and up stored as one tensor (Phi-3, GLM).
        "gate_up_proj": _role("gate_up_proj", f"2 × {_WIDTH}", "hidden_size"),
    }

    def present(self, spec: ModelSpec) -> bool:
        """Some block is dense: a decoder layer the MoE block leaves dense, or a
        dense MTP block."""
        if any(not spec.is_moe_layer(i) for i in range(spec.num_hidden_layers)):
            return True
        return spec.mtp is not None and spec.mtp.mlp == "dense"

    def checkpoint_roles(self, spec: ModelSpec) -> tuple[str, ...]:
        if "gate_up_proj" in spec.checkpoint.fused:
            return ("gate_up_proj", "down_proj")
        return ("gate_proj", "up_proj", "down_proj")

    def config(self, spec: ModelSpec) -> dict[str, Any]:
        # Written with the MoE block's keys (onboard.spec.hf), which decide whose
        # width intermediate_size is.
        return {}

    def rules(self, spec: ModelSpec, report: Report) -> None:
        if self.present(spec) and spec.mlp.intermediate_size is None:
            report(
                ("mlp", "intermediate_size"),
                "some layers are dense, so mlp.intermediate_size is required",
            )

    def plan(self, spec: ModelSpec, layer: int | None) -> DenseMLP | None:
        """The one dense MLP every dense block has (``layer`` aside)."""
        size = spec.mlp.intermediate_size
        return None if size is None else DenseMLP(size)

    def tensors(self, spec: ModelSpec, layer: Layer) -> list[TensorPlan]:
        if not isinstance(layer.mlp, DenseMLP):
            return []
        return [
            TensorPlan(
                f"{self.tensor_name(spec, role, layer.index)}.weight",
                self.roles[role].shape(spec),
                "normal",
                layer.index,
            )
            for role in self.checkpoint_roles(spec)
        ]


COMPONENT = _DenseMLP()
