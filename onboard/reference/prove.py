"""Prove an inferred spec against transformers' own class for its family.

A config.json does not state everything a model computes (norm placement, which
keys the family's code ignores, fused tensors), so a spec read from one is checked
by running it: transformers builds a tiny random model of the family from the
config, shrunk by onboard's shrink rule (every layer kind kept: MoE and dense,
sliding and full, KV sharing), and saves it; the reference onboard generates for
the spec loads those very weights under the spec's tensor names and must give the
same logits (float32, within :data:`RTOL` of the largest). A tensor the spec does
not name, a tensor it names that transformers lacks, or a layer that computes
something else fails the proof, with the first diverging layer and sublayer named.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from onboard.arch.tensors import plan_tensors
from onboard.errors import InputError
from onboard.reference.remote import RemoteCode
from onboard.spec.hf import quiet_transformers
from onboard.spec.model import ModelSpec
from onboard.spec.module_tree import module_names
from onboard.spec.shrink import shrink_spec, tiny_config_overrides

RTOL = 1e-4  # of the largest logit
SEQ = 24  # tokens per prompt; more than a tiny sliding window (shrink keeps 16)
_NORM_STD = 0.5  # randomised norm weights around their initial value
_BIAS_STD = 0.1  # randomised biases (transformers starts them at zero)
_SINK_STD = 1.0  # attention sinks, of the order of the attention scores' spread
_WEIGHT_STD = 0.02  # weights left at zero (transformers' usual initializer_range)


def proof_tokens(spec: ModelSpec) -> int:
    """Tokens per prompt of the proof: :data:`SEQ`, or past the first chunk
    boundary of the shrunk model's chunked attention (Llama-4's)."""
    chunk = shrink_spec(spec).attention.chunk_size
    return SEQ if chunk is None else max(SEQ, chunk + SEQ)


class ProofFailed(InputError):
    """The generated reference does not compute what transformers computes."""


@dataclass(frozen=True)
class Proof:
    """What was proven, for the spec's header comment."""

    model_class: str  # transformers' class, e.g. LlamaForCausalLM
    transformers_version: str
    num_layers: int  # decoder layers of the tiny model
    max_rel_diff: float  # of the logits, relative to the largest
    seconds: float
    mtp_heads: int  # the spec's MTP heads, which transformers' classes lack
    # What the config does not state and the proof chose (onboard.reference.infer).
    found: dict[str, Any] = field(default_factory=dict)
    remote: str | None = None  # the directory of the family's own code, if proven so
    # A multimodal wrapper's modules outside its language model (text only).
    skipped: tuple[str, ...] = ()

    def header(self) -> str:
        against = f"transformers {self.transformers_version} {self.model_class}"
        if self.remote:
            against = (
                f"{self.model_class}, the family's own code in {self.remote} "
                f"(auto_map), run by transformers {self.transformers_version}"
            )
        text = (
            f"proven against {against}: on a tiny random model "
            f"({self.num_layers} layers, float32) the reference generated for this "
            f"spec gives its logits within "
            f"{self.max_rel_diff:.1e} of the largest ({self.seconds:.0f} s)"
        )
        if self.found:
            shown = ", ".join(f"{k} {json.dumps(v)}" for k, v in self.found.items())
            text += f"; what the config does not state, as the proof found it: {shown}"
        if self.skipped:
            text += (
                f"; on text only: the wrapper's {', '.join(self.skipped)} "
                "(vision) is not part of the generated model"
            )
        if self.mtp_heads:
            heads = "head is" if self.mtp_heads == 1 else "heads are"
            text += (
                f"; its {self.mtp_heads} MTP {heads} not part of the proof "
                f"({self.model_class} has none)"
            )
        return text


def prove_spec(
    spec: ModelSpec, config: dict[str, Any], remote: RemoteCode | None = None
) -> Proof:
    """Prove ``spec`` (inferred from ``config``) against transformers' class for
    ``config["model_type"]`` (or the family's ``remote`` code); raises
    :class:`ProofFailed` naming what differs."""
    with family_model(spec, config, remote) as family:
        return family.prove(spec)


@contextmanager
def family_model(
    spec: ModelSpec, config: dict[str, Any], remote: RemoteCode | None = None
) -> Iterator[FamilyModel]:
    """The tiny random model of ``config``'s family (transformers' class, or the
    ``remote`` code shipped with the config), shrunk as ``spec`` is, saved to a
    temporary directory and run once."""
    import torch
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    start = time.perf_counter()
    cls = remote.config_class if remote else CONFIG_MAPPING[spec.model_type]
    overrides = tiny_config_overrides(spec)
    prefix = spec.checkpoint.language_model_prefix
    try:
        with _quiet():
            tiny = cls.from_dict(unquantized(config))
            text = tiny.get_text_config() if prefix else tiny
            text.update(overrides)
            torch.manual_seed(0)
            if remote:
                model = remote.model_class(tiny).to(torch.float32)
            elif prefix:
                # A multimodal wrapper, run on text alone: its language model's
                # path is what the spec describes; the vision tower is shrunk.
                from transformers import AutoModelForImageTextToText

                shrink_vision(tiny)
                model = AutoModelForImageTextToText.from_config(
                    tiny, dtype=torch.float32, attn_implementation="eager"
                )
            else:
                # Eager attention is transformers' reference math: SDPA drops
                # what it cannot express (Gemma-2's attention soft-capping).
                model = auto_class(spec.model_type).from_config(
                    tiny, dtype=torch.float32, attn_implementation="eager"
                )
    except Exception as exc:  # transformers' own code on a config it accepted
        raise ProofFailed(
            f"{spec.name}: transformers' {cls.__name__} cannot build the tiny model "
            f"of the family to prove the spec against: {_one_line(exc)}"
        ) from None
    _randomise(model)
    model_class = type(model).__name__
    ids = torch.randint(
        0,
        int(text.vocab_size),
        (2, proof_tokens(spec)),
        generator=torch.Generator().manual_seed(1),
    )
    their_layers = _layers_path(model, prefix)
    try:
        with torch.no_grad(), _capture(model, their_layers, "self_attn") as want:
            logits = model.eval()(ids).logits
    except Exception as exc:
        raise ProofFailed(
            f"{spec.name}: transformers' {model_class} fails on the tiny model of the "
            f"family: {_one_line(exc)}"
        ) from None
    with tempfile.TemporaryDirectory(prefix="onboard-proof-") as tmp:
        saved = Path(tmp) / "family"
        with _quiet():
            model.save_pretrained(saved)
        yield FamilyModel(
            model_class=model_class,
            remote=str(remote.directory) if remote else None,
            overrides=overrides,
            num_layers=int(text.num_hidden_layers),
            prefix=prefix,
            # Where the wrapper saved its language model (for `spec from-hf`).
            saved_prefix=_language_model_prefix(saved) if prefix else None,
            saved=saved,
            ids=ids,
            logits=logits,
            want=want,
            started=start,
        )


# Keys the tiny model is built without: the family's remote code (the proof
# uses transformers' class or RemoteCode) and the published checkpoint's own
# quantization (checkpoint.source_quantization), which would make transformers
# build FP8 or MXFP4 layers; the proof is of the architecture, in float32.
_NOT_BUILT = ("auto_map", "quantization_config")


def unquantized(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` without :data:`_NOT_BUILT` (a wrapper's text_config too)."""
    out = {k: v for k, v in config.items() if k not in _NOT_BUILT}
    if isinstance(out.get("text_config"), dict):
        out["text_config"] = unquantized(out["text_config"])
    return out


@dataclass
class FamilyModel:
    """A saved tiny model of a family and its float32 forward on fixed tokens."""

    model_class: str
    overrides: dict[str, Any]  # the shrunk config's keys (tiny_config_overrides)
    num_layers: int
    saved: Path  # save_pretrained's directory
    ids: Any  # token ids (torch)
    logits: Any  # transformers' logits on ids
    want: dict[str, list]  # transformers' per-layer captures (_capture)
    started: float  # perf_counter when the proof began
    remote: str | None = None  # the directory of the family's own code
    # A multimodal wrapper's: where its language model's `model.*` tensors are.
    prefix: str | None = None
    saved_prefix: str | None = None
    tries: int = 0

    @cached_property
    def saved_tensors(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of what save_pretrained wrote (as a user's checkpoint)."""
        from onboard.safetensors_header import read_header

        return {
            t.name: t.shape
            for f in self.saved.glob("*.safetensors")
            for t in read_header(f).tensors
        }

    @cached_property
    def tensors(self) -> dict[str, tuple[int, ...]]:
        """The saved tensors as the generated model loads them: a wrapper's
        language model's under `model.`, its other modules' left out."""
        if self.prefix is None:
            return self.saved_tensors
        return {
            new: shape
            for name, shape in self.saved_tensors.items()
            if (new := self.loaded_name(name)) is not None
        }

    def loaded_name(self, name: str) -> str | None:
        """A saved tensor's name as the generated model loads it (None: a
        wrapper's module outside the language model)."""
        if self.prefix is None:
            return name
        if name.startswith(self.prefix + "."):
            return "model." + name[len(self.prefix) + 1 :]
        return name if name.startswith("lm_head.") else None

    def wrapper_modules(self) -> list[str]:
        """A wrapper's modules outside its language model: its top-level ones
        (`vision_tower`), or those under `model.` (`model.visual`)."""
        out = set()
        for name in self.saved_tensors:
            if self.loaded_name(name) is None:
                parts = name.split(".")
                out.add(".".join(parts[:2] if parts[0] == "model" else parts[:1]))
        return sorted(out)

    def named(self, spec: ModelSpec) -> dict[str, tuple[int, ...]]:
        """Name -> shape of the tensors the spec names on the tiny model, its MTP
        heads left out (transformers' classes have none)."""
        # The tiny model keeps the vocabulary (tiny_config_overrides).
        tiny = shrink_spec(spec).model_copy(update={"vocab_size": spec.vocab_size})
        return {
            p.name: tuple(p.shape)
            for p in plan_tensors(tiny)
            if p.layer is None or p.layer < self.num_layers
        }

    def misfits(self, spec: ModelSpec) -> int:
        """How far the spec's tensors are from transformers': a tensor one names
        and the other lacks counts two, a shape that differs one (a right name
        with a wrong shape is nearer)."""
        named = self.named(spec)
        shapes = sum(
            named[n] != self.tensors[n] for n in set(named) & set(self.tensors)
        )
        outside = set(self.wrapper_modules()) ^ set(spec.checkpoint.skipped_prefixes)
        return 2 * len(set(named) ^ set(self.tensors)) + shapes + 2 * len(outside)

    def misfit(self, spec: ModelSpec) -> list[str]:
        """How the tensors the spec names differ from the saved ones, one line per
        kind of difference; empty if they fit."""
        named = self.named(spec)
        lines = []
        extra = sorted(set(self.tensors) - set(named))
        if extra:
            lines.append(
                f"transformers' {self.model_class} has tensors the spec does not "
                f"name: {_some(extra)}"
            )
        missing = sorted(set(named) - set(self.tensors))
        if missing:
            lines.append(
                f"the spec names tensors {self.model_class} does not have: "
                f"{_some(missing)}"
            )
        shapes = [
            f"{n} is {list(self.tensors[n])}, the spec's {list(named[n])}"
            for n in sorted(set(named) & set(self.tensors))
            if named[n] != self.tensors[n]
        ]
        if shapes:
            lines.append(f"shapes differ: {_some(shapes)}")
        outside = self.wrapper_modules()
        if outside != sorted(spec.checkpoint.skipped_prefixes):
            lines.append(
                f"the wrapper's modules outside its language model are "
                f"{_some(outside)}, checkpoint.skipped_prefixes says "
                f"{_some(list(spec.checkpoint.skipped_prefixes))}"
            )
        return lines

    def prove(self, spec: ModelSpec) -> Proof:
        """Load the saved weights into the reference generated for ``spec`` and
        compare logits; raises :class:`ProofFailed` naming what differs."""
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        from onboard.reference import install_reference

        if tiny_config_overrides(spec) != self.overrides:
            raise AssertionError("the spec is not shrunk as the family model was")
        misfit = self.misfit(spec)
        if misfit:
            raise ProofFailed(
                f"{spec.name}: the spec's checkpoint layout does not fit the "
                "family's tensors:\n" + "\n".join(f"  - {line}" for line in misfit)
            )
        # A directory per try: transformers imports remote code once per path.
        self.tries += 1
        ckpt = self.saved.with_name(f"try-{self.tries}")
        ckpt.mkdir()
        if self.prefix is not None:
            self._write_text_view(spec, ckpt)
        else:
            for path in self.saved.iterdir():
                if path.suffix == ".safetensors" or path.name.endswith(".index.json"):
                    (ckpt / path.name).symlink_to(path)
                else:
                    shutil.copy(path, ckpt / path.name)
        install_reference(spec, ckpt)
        names = module_names(spec)
        try:
            with _quiet():
                got_model, info = AutoModelForCausalLM.from_pretrained(
                    ckpt,
                    trust_remote_code=True,
                    dtype=torch.float32,
                    output_loading_info=True,
                )
        except Exception as exc:  # the reference cannot load what the spec says
            raise ProofFailed(
                f"{spec.name}: the reference generated for the spec cannot load the "
                f"family's tiny model: {_one_line(exc)}"
            ) from None
        # misfit() found the same tensors; the MTP heads are the spec's own.
        heads = f"{names['base']}.{names['layers']}.{self.num_layers}"
        if info["unexpected_keys"] or any(
            not k.startswith(heads) for k in info["missing_keys"]
        ):
            raise AssertionError(f"the reference loads other tensors: {info}")
        layers = f"{names['base']}.{names['layers']}"
        try:
            with torch.no_grad(), _capture(got_model, layers, names["attn"]) as got:
                got_logits = got_model.eval()(self.ids).logits
        except Exception as exc:  # the reference cannot run what the spec says
            raise ProofFailed(
                f"{spec.name}: the reference generated for the spec fails on the "
                f"family's tiny model: {_one_line(exc)}"
            ) from None
        rel = _rel(got_logits, self.logits)
        if rel >= RTOL:
            raise ProofFailed(_divergence(spec, self.model_class, self.want, got, rel))
        return Proof(
            model_class=self.model_class,
            transformers_version=transformers.__version__,
            num_layers=len(self.want["layers"]),
            max_rel_diff=rel,
            seconds=time.perf_counter() - self.started,
            mtp_heads=spec.mtp.num_heads if spec.mtp else 0,
            remote=self.remote,
            skipped=tuple(spec.checkpoint.skipped_prefixes),
        )

    def _write_text_view(self, spec: ModelSpec, ckpt: Path) -> None:
        """A wrapper's language model as the generated vLLM model loads it
        (checkpoint.language_model_prefix, skipped_prefixes): its tensors renamed,
        the wrapper's other modules left out, text_config as the config."""
        from safetensors.torch import load_file, save_file

        skipped = tuple(p + "." for p in spec.checkpoint.skipped_prefixes)
        tensors = {}
        for path in self.saved.glob("*.safetensors"):
            for name, tensor in load_file(path).items():
                new = self.loaded_name(name)
                if new is not None:
                    tensors[new] = tensor
                elif not name.startswith(skipped):
                    tensors[name] = tensor  # the spec names it not: misfit()
        save_file(tensors, ckpt / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((self.saved / "config.json").read_text())
        text = {
            **config["text_config"],
            "model_type": spec.model_type,
            "architectures": [spec.architecture],
            "tie_word_embeddings": config.get("tie_word_embeddings", False),
        }
        (ckpt / "config.json").write_text(json.dumps(text, indent=2))


def auto_class(model_type: str):
    """transformers' auto class that builds ``model_type``'s causal LM: Mistral-4
    registers its ForCausalLM only as an image-text-to-text model."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
    )

    other = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES.get(model_type, "")
    if model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES and other.endswith(
        "ForCausalLM"
    ):
        return AutoModelForImageTextToText
    return AutoModelForCausalLM


def _language_model_prefix(saved: Path) -> str | None:
    """The module a wrapper saved its language model's embeddings under (its
    `model.` tensors' prefix: `model.language_model`, Gemma-3's
    `language_model.model`)."""
    from onboard.safetensors_header import read_header

    found = {
        t.name.removesuffix(".embed_tokens.weight")
        for f in saved.glob("*.safetensors")
        for t in read_header(f).tensors
        if t.name.endswith(".embed_tokens.weight")
    }
    return found.pop() if len(found) == 1 else None


# A multimodal wrapper's vision tower in the proof (the language model's own
# sizes are shrunk by spec): one block of the smallest width, where the vision
# config class has the key.
VISION_SMALL = dict(
    depth=1,
    num_hidden_layers=1,
    hidden_size=32,
    intermediate_size=32,
    num_heads=2,
    num_attention_heads=2,
)


def shrink_vision(config) -> None:
    """Shrink a wrapper config's vision tower (in place) to :data:`VISION_SMALL`,
    projecting into the language model's width."""
    vision = getattr(config, "vision_config", None)
    if vision is None:
        return
    declared = vision.to_dict()
    vision.update({k: v for k, v in VISION_SMALL.items() if k in declared})
    if "out_hidden_size" in declared:
        vision.update({"out_hidden_size": config.get_text_config().hidden_size})


def _randomise(model) -> None:
    """Norm weights start at one and biases at zero, where a misplaced norm or a
    dropped bias computes the same: move them. Attention sinks start near zero,
    where a sink takes about one key's share: make them matter. A weight the
    family's init leaves at zero (ERNIE-4.5-MoE's router) scores every expert
    alike, where softmax and sigmoid routing pick and weigh the same: draw it."""
    import torch

    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            noise = torch.randn(tensor.shape, generator=gen)
            module = name.rsplit(".", 2)[-2]
            # A norm's weight, and one with a row per head (Cohere's q/k norms).
            if (tensor.ndim == 1 and "norm" in name) or (
                tensor.ndim == 2 and "norm" in module
            ):
                tensor.add_(noise * _NORM_STD)
            elif name.endswith("sinks"):
                tensor.copy_(noise * _SINK_STD)
            elif name.endswith(("bias", "e_score_correction_bias")):
                # .bias, and biases stored beside stacked weights (gate_up_proj_bias)
                tensor.copy_(noise * _BIAS_STD)
            elif tensor.ndim >= 2 and tensor.is_floating_point() and not tensor.any():
                tensor.copy_(noise * _WEIGHT_STD)


def _layers_path(model, prefix: str | None) -> str:
    """Where the decoder layers of transformers' ``model`` are: under the
    wrapper's language model, the base model prefix, or ``model`` (Llama-4's
    causal LM names its prefix language_model but keeps them under model)."""
    for base in (prefix, model.base_model_prefix, "model"):
        if base is None:
            continue
        try:
            model.get_submodule(f"{base}.layers")
        except AttributeError:
            continue
        return f"{base}.layers"
    return f"{prefix or model.base_model_prefix}.layers"


@contextmanager
def _capture(model, layers_path: str, attn_name: str) -> Iterator[dict[str, list]]:
    """Record each decoder layer's output and its attention's output."""
    out: dict[str, list] = {"layers": [], "attn": [], "input": []}
    handles = []
    try:
        stack = model.get_submodule(layers_path)
    except AttributeError:  # another module tree: no per-layer localisation
        stack = []
    for i, layer in enumerate(stack):
        if i == 0:  # what the embedding gave the first layer
            handles.append(
                layer.register_forward_pre_hook(_input_recorder(out["input"]))
            )
        handles.append(layer.register_forward_hook(_recorder(out["layers"])))
        attn = getattr(layer, attn_name, None)
        if attn is not None:
            handles.append(attn.register_forward_hook(_recorder(out["attn"])))
    try:
        yield out
    finally:
        for h in handles:
            h.remove()


def _recorder(into: list):
    def hook(_module, _args, output) -> None:
        into.append(output[0] if isinstance(output, tuple) else output)

    return hook


def _input_recorder(into: list):
    def hook(_module, args) -> None:
        if args:
            into.append(args[0])

    return hook


def _some(items: list[str], n: int = 6) -> str:
    more = f" (and {len(items) - n} more)" if len(items) > n else ""
    return ", ".join(items[:n]) + more


def _one_line(exc: BaseException) -> str:
    return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]


def _rel(got, want) -> float:
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def _divergence(spec, model_class: str, want: dict, got: dict, rel: float) -> str:
    where = "the final norm or the output head"
    first_in = list(zip(want["input"], got["input"], strict=False))[:1]
    if any(w.shape != g.shape or _rel(g, w) >= RTOL for w, g in first_in):
        return _diverged(spec, model_class, rel, "the embedding (before layer 0)")
    for i, (w, g) in enumerate(zip(want["layers"], got["layers"], strict=False)):
        if w.shape == g.shape and _rel(g, w) < RTOL:
            continue
        attn_ok = (
            i < len(want["attn"])
            and i < len(got["attn"])
            and want["attn"][i].shape == got["attn"][i].shape
            and _rel(got["attn"][i], want["attn"][i]) < RTOL
        )
        where = (
            f"layer {i}, after attention (its MLP, norms or residual)"
            if attn_ok
            else f"layer {i}, attention (or the norm before it)"
        )
        break
    return _diverged(spec, model_class, rel, where)


def _diverged(spec: ModelSpec, model_class: str, rel: float, where: str) -> str:
    return (
        f"{spec.name}: the reference generated for the inferred spec differs from "
        f"transformers' {model_class} (logits {rel:.1e} of the largest apart); "
        f"first divergence: {where}. The family computes something its config "
        "does not state, so the spec would be silently wrong (`--no-verify` "
        "writes it unproven)"
    )


@contextmanager
def _quiet() -> Iterator[None]:
    """transformers' warnings off (spec.hf), and its progress bars: a
    seconds-long proof needs none."""
    from transformers.utils import logging

    bars = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        with quiet_transformers():
            yield
    finally:
        if bars:
            logging.enable_progress_bar()
