"""What the model does to its token embeddings before the first layer: Gemma
multiplies them by ``sqrt(hidden_size)``, the factor rounded to the
embedding's dtype (``scale_embedding``); Granite by ``embedding_multiplier``.

In the vLLM model, Gemma's factor is a buffer applied in ``embed_input_ids`` (so
a speculative draft sharing the embedding gets it too), as vLLM's
``gemma2.py`` does; Granite's is applied to the first rank's hidden states, as
vLLM's ``granite.py`` does. The component is always present (every model embeds
its tokens), its node neutral where the spec sets neither; the embedding
tensor itself is the model's (role ``embed``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import Field

from onboard.components.base import ModelWide, Report, Section

if TYPE_CHECKING:
    from onboard.arch.config_keys import ConfigKeys
    from onboard.spec.model import ModelSpec


class EmbeddingsFields(Section):
    scale_embedding: bool = Field(
        False,
        description="Multiply the token embeddings by sqrt(hidden_size), the "
        "factor rounded to the embedding's dtype (Gemma's normalizer); not "
        "beside an embedding_multiplier.",
    )
    embedding_multiplier: float = Field(
        1.0,
        gt=0,
        description="Factor on the token embeddings before the first layer "
        "(Granite's `embedding_multiplier`).",
    )


@dataclass(frozen=True)
class Embeddings:
    """The factors on the token embeddings (neutral: none)."""

    sqrt_hidden: bool = False  # times sqrt(hidden_size), in the embedding's dtype
    multiplier: float = 1.0


@dataclass(frozen=True)
class EmbeddingsKeys:
    """What the generated code prints: whether it scales by sqrt(hidden_size),
    and the config key of the multiplier (None: not applied)."""

    sqrt_hidden: bool
    multiplier: str | None


class _Embeddings(ModelWide):
    name = "embeddings"
    label = "the token embeddings"
    Fields = EmbeddingsFields
    Node = Embeddings
    concept_fields = {
        "scale_embedding": ("scale_embedding",),
        "embedding_multiplier": ("embedding_multiplier",),
    }
    vllm_slots = (
        "model.attributes",
        "model.buffers",
        "model.embed_input_ids",
        "model.first_rank",
    )
    hf_slots = ("model.embed", "model.inputs")

    def rules(self, spec: ModelSpec, report: Report) -> None:
        if spec.scale_embedding and spec.embedding_multiplier != 1.0:
            # No family has both: which factor comes first would be a guess.
            report(
                ("scale_embedding",), "is not generated beside an embedding_multiplier"
            )

    def plan(self, spec: ModelSpec, layer: int | None) -> Embeddings:
        return Embeddings(spec.scale_embedding, spec.embedding_multiplier)

    def code_context(self, node: Embeddings, keys: ConfigKeys) -> EmbeddingsKeys:
        return EmbeddingsKeys(
            sqrt_hidden=node.sqrt_hidden,
            multiplier=keys.factor("embedding_multiplier", node.multiplier),
        )


COMPONENT = _Embeddings()
