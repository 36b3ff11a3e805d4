"""What a spec asks of its targets: warnings for what a target can only emulate,
errors for what cannot run at all.

`onboard spec check` calls :func:`check_spec_targets` after the spec itself is
valid: warnings are printed and leave the exit code at 0; errors exit 2, located
like every other spec problem. The rules:

* a scheme a listed GPU target only **emulates** (no native number format there,
  e.g. NVFP4 on H100 or MI355X) -> warning: it runs, but its speed and kernels
  there say nothing about the native format (the cpu target emulates FP8 by
  nature: it stands in for validation, not for speed, so no warning);
* a scheme the **cpu** target cannot run (vLLM's CPU build has no FP4 kernels) ->
  warning: the `quant:<scheme>` check is not-run on cpu and runs on the GPU
  targets;
* a scheme a listed **GPU** target cannot run -> error;
* a scheme that **no listed target** can run -> error (nothing would ever load
  that checkpoint);
* MLA whose latent (kv_lora_rank + qk_rope_head_dim) is not 576 with the cpu
  target -> warning (the CPU MLA decode kernel takes 576 only), or an error when
  cpu is the only target;
* Gated DeltaNet head dims or convolution width vLLM's CPU kernels refuse, with
  the cpu target -> warning (the cpu engine cannot run the model; generate,
  tiny and the GPU targets can);
* an index head dim that is not a multiple of 128 -> error beside a GPU target
  (vLLM's indexer quantizes the index queries to FP8 in groups of 128 dims and
  asserts it), warning with cpu alone (the cpu engine runs sparse MLA densely,
  without the indexer op).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from onboard import components
from onboard.spec.model import ModelSpec
from onboard.targets import load_profiles
from onboard.targets.cpu_kernels import (
    CPU_MLA_LATENT,
    cpu_gdn_problems,
)

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class TargetFinding:
    level: Literal["warning", "error"]
    path: Loc
    message: str


def target_findings(spec: ModelSpec) -> list[TargetFinding]:
    profiles = load_profiles()
    moe = spec.mlp.moe is not None
    out: list[TargetFinding] = []
    for i, scheme in enumerate(spec.quantization):
        runs = []
        for j, name in enumerate(spec.targets):
            target = profiles[name]
            support = target.schemes[scheme]
            level = support.level(moe)
            why = support.note or support.linear or ""
            if level == "native":
                runs.append(name)
            elif level == "emulated":
                runs.append(name)
                if not target.is_gpu:
                    continue  # cpu stands in for validation; speed is not its point
                out.append(
                    TargetFinding(
                        "warning",
                        ("quantization", i),
                        f"{scheme} is only emulated on {name} ({why}); it runs, but "
                        "its speed there says nothing about the native format",
                    )
                )
            elif target.is_gpu:
                out.append(
                    TargetFinding(
                        "error",
                        ("targets", j),
                        f"{name} cannot run {scheme} in vLLM 0.32 ({why})",
                    )
                )
            else:
                out.append(
                    TargetFinding(
                        "warning",
                        ("quantization", i),
                        f"the cpu target cannot run {scheme} ({why}); "
                        f"quant:{scheme} is not-run on cpu",
                    )
                )
        if not runs:
            native = [
                n for n, p in profiles.items() if p.schemes[scheme].support == "native"
            ]
            out.append(
                TargetFinding(
                    "error",
                    ("quantization", i),
                    f"no target of this spec ({', '.join(spec.targets)}) can run "
                    f"{scheme}; add one that runs it natively "
                    f"({', '.join(native)}) or drop the scheme",
                )
            )
    mla = spec.attention.mla
    if spec.attention.type == "mla" and mla is not None and "cpu" in spec.targets:
        latent = mla.kv_lora_rank + mla.qk_rope_head_dim
        if latent != CPU_MLA_LATENT:
            only_cpu = spec.targets == ["cpu"]
            out.append(
                TargetFinding(
                    "error" if only_cpu else "warning",
                    ("attention", "mla", "kv_lora_rank"),
                    f"the cpu target's MLA decode kernel only takes kv_lora_rank + "
                    f"qk_rope_head_dim = {CPU_MLA_LATENT}, this spec has {latent}: "
                    + (
                        "no target of this spec can run it"
                        if only_cpu
                        else "the cpu engine cannot run this model"
                    ),
                )
            )
    out += _kernel_and_component_findings(spec, profiles)
    return out


def _kernel_and_component_findings(spec: ModelSpec, profiles) -> list[TargetFinding]:
    out: list[TargetFinding] = []
    lin = spec.linear_attention
    if lin is not None and lin.type == "gated_deltanet" and "cpu" in spec.targets:
        problems = cpu_gdn_problems(
            lin.key_head_dim, lin.value_head_dim, lin.conv_kernel_size
        )
        if problems:
            field = (
                "conv_kernel_size"
                if lin.key_head_dim == lin.value_head_dim
                and lin.key_head_dim in (64, 128)
                else "key_head_dim"
            )
            out.append(
                TargetFinding(
                    "warning",
                    ("linear_attention", field),
                    "the cpu engine's Gated DeltaNet kernels cannot run this "
                    f"model: {'; '.join(problems)}",
                )
            )
    gpus = [t for t in spec.targets if profiles[t].is_gpu]
    for component in components.present(spec):
        component.target_rules(
            spec, gpus, lambda *finding: out.append(TargetFinding(*finding))
        )
    return out


def check_spec_targets(path: str | Path, spec: ModelSpec) -> list[str]:
    """Located warnings for ``spec`` (read from ``path``); raises SpecError
    (exit 2) listing the located errors when there are any."""
    from onboard.spec.loader import Problem, SpecError, spec_locator

    findings = target_findings(spec)
    if not findings:
        return []
    locate = spec_locator(Path(path))
    problems = {"warning": [], "error": []}
    for f in findings:
        line, col = locate(f.path)
        problems[f.level].append(
            Problem(str(path), line, col, _dotted(f.path), f.message)
        )
    if problems["error"]:
        raise SpecError(problems["error"])
    return [str(p) for p in problems["warning"]]


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += (
            f"[{part}]" if isinstance(part, int) else ("." if out else "") + str(part)
        )
    return out
