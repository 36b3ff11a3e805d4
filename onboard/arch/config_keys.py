"""Which Hugging Face config attribute the generated files read for each concept.

The generated vLLM model and the generated Hugging Face reference both read their
sizes and per-layer plans from the config object the checkpoint ships (in vLLM
``vllm_config.model_config.hf_config``), so one generated file serves the
full-size checkpoint and its tiny shrunk copy alike. The attribute names are not
guessed per family: they are taken from the config that
:func:`onboard.spec.hf.hf_config_from_spec` writes for this very spec (the same
names transformers' own config class serialises), and each one is checked to hold
the spec's value, so a field that means something else under the same name is
caught at generation time instead of at load time. ``ArchPlan.config`` holds the
one instance both generators use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import cached_property
from typing import Any

from onboard.components.base import is_int
from onboard.spec.config_aliases import read_keys
from onboard.spec.model import ModelSpec
from onboard.templating import GenerationError

# Which layers are MoE, by the family's own arithmetic: Qwen's decoder_sparse_step
# counts layers from 1 (layer i is MoE when (i + 1) % N == 0), DeepSeek's
# moe_layer_freq from 0 (i % N == 0, as vLLM's deepseek_v2 reads it).
MOE_FREQUENCY_RULES: dict[str, str] = {
    "decoder_sparse_step": "(layer_idx + 1) % config.{name} == 0",
    "moe_layer_freq": "layer_idx % config.{name} == 0",
}


def eps_concept(spec: ModelSpec) -> str:
    """The concept of the norms' eps: the key families use for the spec's norm
    kind."""
    return "layer_norm_eps" if spec.norm.type == "layernorm" else "rms_norm_eps"


def _hf_config(spec: ModelSpec) -> dict[str, Any]:
    from onboard.spec.hf import hf_config_from_spec, hf_text_config

    # A multimodal wrapper's model reads its language model's config (vLLM's
    # hf_text_config).
    return dict(hf_text_config(hf_config_from_spec(spec)))


def unset_keys(spec: ModelSpec) -> frozenset[str]:
    """Keys of the spec's config.json that a checkpoint of a family transformers
    knows may leave out (or null) when the generated vLLM model serves it, because
    transformers' class computes the same model without them:

    - the family's keys vLLM's in-tree model reads although transformers' class
      declares none (:attr:`onboard.spec.hf.Family.vllm_keys`: DeepSeek-V3's
      ``scoring_func`` and ``topk_method``): transformers' code hard-codes their
      value, and so does the generated model, which does not read them;
    - ``n_group`` and ``topk_group`` of a router without expert groups: the
      generated model routes plainly or with one group of all experts, and reads
      neither (transformers' DeepSeek-V2 writes them as null).
    """
    from onboard.spec.hf import FAMILIES, transformers_knows

    family = FAMILIES.get(spec.model_type)
    if family is None or not transformers_knows(spec.model_type):
        return frozenset()
    keys = set(family.vllm_keys)
    moe = spec.mlp.moe
    if moe is not None and moe.router.num_groups is None:
        keys |= {"n_group", "topk_group"}
    return frozenset(keys)


def _key_means(spec: ModelSpec) -> dict[str, str]:
    """Keys the spec's family gives another concept than the alias table does
    (Llama-4's use_qk_norm: its weightless q/k norm)."""
    from onboard.spec.hf import FAMILIES, KEY_MEANS, text_model_type, transformers_knows

    model_type = spec.model_type
    if spec.checkpoint.language_model_prefix is not None:
        model_type = text_model_type(model_type) or model_type
    family = FAMILIES.get(model_type)
    if family is None or not transformers_knows(model_type):
        return {}
    return dict(family.facts.get(KEY_MEANS, {}))


class ConfigKeys:
    """Resolves concepts to the config attribute names of one spec's HF config."""

    def __init__(self, spec: ModelSpec, hf: Mapping[str, Any] | None = None):
        self.spec = spec
        self.hf = dict(hf) if hf is not None else _hf_config(spec)
        self.means = _key_means(spec)

    @cached_property
    def unset(self) -> frozenset[str]:
        """Keys the generated vLLM model does not read (:func:`unset_keys`)."""
        return unset_keys(self.spec)

    @cached_property
    def family_code(self) -> bool:
        """Whether transformers ships the model type's code (then the config is
        its class's, which may leave keys onboard writes unset)."""
        from onboard.spec.hf import transformers_knows

        return transformers_knows(self.spec.model_type)

    def _keys(self, concept: str) -> tuple[str, ...]:
        """The keys ``concept`` may be read from in this family: its aliases but
        those the family gives another meaning, and those it gives this one."""
        own = tuple(k for k, c in self.means.items() if c == concept)
        return own + tuple(k for k in read_keys(concept) if k not in self.means)

    def find(
        self,
        concept: str,
        value: Any = None,
        check: Callable[[Any], bool] | None = None,
    ) -> str | None:
        """The first alias present in the config (whose value matches), or None."""
        for name in self._keys(concept):
            if name not in self.hf or self.hf[name] is None:
                continue
            got = self.hf[name]
            if check is not None and not check(got):
                continue
            if value is not None and check is None and got != value:
                continue
            return name
        return None

    def moe_layer_terms(self, var: str) -> list[str]:
        """The terms (of ``config`` and the layer index ``var``) whose conjunction
        is true on MoE layers, from the placement fields the config has: a
        per-layer ``mlp_layer_types`` list alone where there is one, else every
        placement key, even at a value that places nothing (the config, not the
        generator, decides). Empty when the config has none."""
        name = self.find("mlp_layer_types", check=lambda v: isinstance(v, list))
        if name is not None:
            return [f'config.{name}[{var}] == "sparse"']
        name = self.find("moe_layers", check=lambda v: isinstance(v, list))
        if name is not None:
            # Llama-4's class lists them (filled from its step where not given).
            return [f"{var} in config.{name}"]
        terms = []
        if (name := self.find("first_k_dense_replace", check=is_int)) is not None:
            terms.append(f"{var} >= config.{name}")
        if (name := self.find("moe_layer_end_index", check=is_int)) is not None:
            terms.append(f"{var} <= config.{name}")
        for concept, rule in MOE_FREQUENCY_RULES.items():
            if (name := self.find(concept, check=is_int)) is not None:
                terms.append(rule.format(name=name).replace("layer_idx", var))
        name = self.find("mlp_only_layers", check=lambda v: isinstance(v, list))
        if name is not None:
            terms.append(f"{var} not in config.{name}")
        return terms

    def dense_width(self) -> str:
        """The key of the dense layers' width: Llama-4's intermediate_size_mlp
        where the config has it (its intermediate_size is the experts'), else
        intermediate_size."""
        value = self.spec.mlp.intermediate_size
        return self.find("intermediate_size_mlp", value) or self.need(
            "intermediate_size", value
        )

    def rope_layer_expr(self, var: str) -> str | None:
        """An expression (of ``config`` and the layer index ``var``) true on the
        layers that apply rope, where some do not: SmolLM3's ``no_rope_layers``
        flags, else (EXAONE-4) the sliding layers of ``layer_types``."""
        name = self.find("no_rope_layers", check=lambda v: isinstance(v, list))
        if name is not None:
            return f"config.{name}[{var}] == 1"
        name = self.find("layer_types", check=lambda v: isinstance(v, list))
        if name is not None:
            return f'config.{name}[{var}] == "sliding_attention"'
        return None

    def factor(self, concept: str, value: float) -> str | None:
        """The key of a factor the generated code applies: read where the config
        holds it (families whose class writes it at 1), required where it is
        not 1; None where the model computes without."""
        return self.find(concept, value) if value == 1.0 else self.need(concept, value)

    def need(
        self,
        concept: str,
        value: Any = None,
        check: Callable[[Any], bool] | None = None,
    ) -> str:
        """Like :meth:`find`, but the concept must be in the config."""
        name = self.find(concept, value, check)
        if name is None:
            present = [a for a in self._keys(concept) if a in self.hf]
            detail = (
                f"; {', '.join(f'{a}={self.hf[a]!r}' for a in present)} "
                f"does not match the spec's {value!r}"
                if present
                else ""
            )
            raise GenerationError(
                f"{self.spec.name}: the Hugging Face config written for this spec "
                f"has no field for {concept} (looked for "
                f"{', '.join(self._keys(concept))}){detail}; the generated files read "
                "its dimensions from config.json, so the config writer "
                "(onboard.spec.hf) and the generator must agree"
            )
        return name
