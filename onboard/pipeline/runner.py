"""Stage table and runner for `onboard new-model`."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

import onboard
from onboard.errors import InputError
from onboard.fsutil import atomic_write_text
from onboard.spec import ModelSpec, dump_spec, load_spec


@dataclass
class Context:
    """What every stage sees: the resolved spec and the output layout."""

    spec: ModelSpec
    out: Path
    full: bool
    console: Console
    # The validate stage's checks (None: checks_for_spec, everything the spec lists).
    checks: list[str] | None = None
    # The whole model files even where the spec is a family vLLM ships.
    standalone: bool = False

    @property
    def generated(self) -> Path:
        return self.out / "generated"

    @property
    def checkpoints(self) -> Path:
        return self.out / "checkpoints"

    @property
    def speculators(self) -> Path:
        return self.out / "speculators"

    @property
    def validation(self) -> Path:
        return self.out / "validation"


@dataclass
class Stage:
    name: str
    run: Callable[[Context], bool | None]
    outputs: Callable[[Context], list[Path]]
    # Stages whose outputs this stage reads (their fingerprints feed into ours).
    reads: tuple[str, ...] = ()
    # Module that must exist for the stage to be available (stages land issue by issue).
    needs_module: str | None = None
    summary: str = ""
    extra_inputs: Callable[[Context], dict] = field(default=lambda ctx: {})

    def available(self) -> bool:
        return (
            self.needs_module is None
            or importlib.util.find_spec(self.needs_module) is not None
        )


def _stage_generate(ctx: Context) -> None:
    from onboard.pipeline.generate import generate_all

    generate_all(ctx.spec, ctx.generated, ctx.standalone)


def _stage_checkpoint(ctx: Context) -> None:
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.speculators.mtp_train import head_trainer

    # No weights can be downloaded here: the bf16 variant is the tiny checkpoint of
    # the spec's architecture, which every later stage validates.
    # MTP heads are trained by self-distillation (about a minute of CPU), so that
    # the spec-decode:mtp check measures a meaningful acceptance.
    write_tiny_checkpoint(
        ctx.spec,
        ctx.checkpoints / "bf16",
        seed=0,
        finish=head_trainer(
            seed=0, log=lambda line: ctx.console.print(f"  {line}", markup=False)
        ),
    )


def _stage_in(module: str) -> Callable[[Context], bool | None]:
    """A stage whose code lives in its own module (``run(ctx)``), imported late."""
    return lambda ctx: importlib.import_module(module).run(ctx)


def _stage_validate(ctx: Context) -> bool:
    from onboard.validate import validate
    from onboard.validate.harness import checks_for_spec

    # The code generated for the full-size spec runs the tiny checkpoint: the model
    # reads its sizes from config.json, so this validates the very files a PR ships.
    bf16 = ctx.checkpoints / "bf16"
    result = validate(
        bf16,
        bf16 / "spec.yaml",
        "cpu",
        ctx.validation,
        generated=ctx.generated,
        checks=",".join(ctx.checks or checks_for_spec(ctx.spec)),
        quantized={
            scheme: ctx.checkpoints / scheme
            for scheme in ctx.spec.quantization
            if (ctx.checkpoints / scheme / "config.json").is_file()
        },
        speculators_dir=ctx.speculators,
        log=lambda line: ctx.console.print(f"  {line}", markup=False),
    )
    for check in result.checks:
        mark = {"passed": "[green]passed[/]", "failed": "[red]failed[/]"}.get(
            check.status, f"[yellow]{check.status}[/]"
        )
        ctx.console.print(f"  {check.name}: {mark}")
    return result.passed


STAGES: list[Stage] = [
    Stage(
        "generate",
        _stage_generate,
        lambda ctx: [ctx.generated / "plugin"],
        needs_module="onboard.generate",
        summary="vLLM model file, plugin, PR tree",
    ),
    Stage(
        "checkpoint",
        _stage_checkpoint,
        lambda ctx: [ctx.checkpoints / "bf16" / "config.json"],
        needs_module="onboard.checkpoint.tiny",
        summary="tiny bf16 checkpoint in the spec's tensor layout",
    ),
    Stage(
        "quantize",
        _stage_in("onboard.pipeline.stage_quantize"),
        lambda ctx: [
            ctx.checkpoints / s / "config.json" for s in ctx.spec.quantization
        ],
        reads=("checkpoint",),
        needs_module="onboard.pipeline.stage_quantize",
        summary="quantized checkpoints, one per scheme the spec lists",
        # A changed quantizer (plan or kernels) reruns the stage, not only a new spec.
        extra_inputs=lambda ctx: {
            "quantizer": importlib.import_module(
                "onboard.pipeline.stage_quantize"
            ).quantizer_code()
        },
    ),
    Stage(
        "speculators",
        _stage_in("onboard.pipeline.stage_speculators"),
        lambda ctx: [ctx.speculators],
        reads=("checkpoint",),
        needs_module="onboard.pipeline.stage_speculators",
        summary="speculative-decoding configs and trained drafts",
    ),
    Stage(
        "validate",
        _stage_validate,
        lambda ctx: [ctx.validation / "validation.json"],
        reads=("generate", "checkpoint", "quantize", "speculators"),
        needs_module="onboard.validate",
        summary="accuracy and checks on the real vLLM engine",
        extra_inputs=lambda ctx: {"checks": ctx.checks},
    ),
]

# Stages later issues add, listed so a run says what it did not do.
PLANNED = {
    "publish": "Hub upload (run `onboard publish` separately)",
}


def _fingerprint(ctx: Context, stage: Stage, done: dict[str, str]) -> str:
    payload = {
        "onboard": onboard.__version__,
        "stage": stage.name,
        "spec": dump_spec(ctx.spec),
        "full": ctx.full,
        "standalone": ctx.standalone,
        "reads": {name: done.get(name, "") for name in stage.reads},
        **stage.extra_inputs(ctx),
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def run_pipeline(
    spec_path: str | Path,
    out: str | Path,
    *,
    stages: list[str] | None = None,
    force: bool = False,
    full: bool = False,
    checks: list[str] | None = None,
    console: Console | None = None,
    standalone: bool = False,
) -> bool:
    """Run the selected (default: all available) stages; False if a check failed."""
    console = console or Console()
    spec = load_spec(spec_path)
    out = Path(out)
    known = {s.name for s in STAGES}
    if stages is not None:
        unknown = [s for s in stages if s not in known and s not in PLANNED]
        if unknown:
            raise InputError(
                f"--stages: unknown stage(s) {', '.join(unknown)}; "
                f"stages are {', '.join([s.name for s in STAGES] + list(PLANNED))}"
            )
        not_built = [s for s in stages if s in PLANNED]
        if not_built:
            raise InputError(
                f"--stages: {', '.join(not_built)} not available in this version of "
                "onboard yet"
            )
    if checks is not None:
        from onboard.validate.harness import parse_checks

        checks = parse_checks(",".join(checks))  # bad names: exit 2 before any work
    ctx = Context(
        spec=spec,
        out=out,
        full=full,
        console=console,
        checks=checks,
        standalone=standalone,
    )
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "spec.yaml", dump_spec(spec))
    state_dir = out / ".onboard"
    state_dir.mkdir(exist_ok=True)

    ok = True
    validated = False  # the validate stage ran, or its result is current
    done: dict[str, str] = {}
    for stage in STAGES:
        if not stage.available():
            console.print(
                f"[yellow]- {stage.name}[/]: not available yet ({stage.summary})"
            )
            continue
        stamp_file = state_dir / f"{stage.name}.json"
        stamp = json.loads(stamp_file.read_text()) if stamp_file.exists() else {}
        fingerprint = _fingerprint(ctx, stage, done)
        if stages is not None and stage.name not in stages:
            # Not selected: later stages read whatever it left on disk last time.
            done[stage.name] = stamp.get("fingerprint", "")
            continue
        outputs_exist = all(p.exists() for p in stage.outputs(ctx))
        if not force and stamp.get("fingerprint") == fingerprint and outputs_exist:
            console.print(f"[dim]= {stage.name}: unchanged, skipped[/]")
            done[stage.name] = fingerprint
            ok = ok and stamp.get("ok", True)
            validated = validated or stage.name == "validate"
            continue
        console.print(f"[bold]> {stage.name}[/]: {stage.summary}")
        start = time.monotonic()
        result = stage.run(ctx)
        validated = validated or stage.name == "validate"
        stage_ok = result is not False
        ok = ok and stage_ok
        seconds = time.monotonic() - start
        atomic_write_text(
            stamp_file,
            json.dumps(
                {
                    "fingerprint": fingerprint,
                    "ok": stage_ok,
                    "seconds": round(seconds, 1),
                },
                indent=2,
            ),
        )
        done[stage.name] = fingerprint
        mark = "[green]ok[/]" if stage_ok else "[red]FAILED[/]"
        console.print(f"  {stage.name}: {mark} in {seconds:.1f}s")
    for name, what in PLANNED.items():
        console.print(f"[yellow]- {name}[/]: not in this version yet ({what})")
    result_file = ctx.validation / "validation.json"
    if validated and result_file.is_file():
        from onboard.report.data import verdict_lines

        # Last, so that the final line says what the run covered.
        for line in verdict_lines(result_file):
            console.print(line, markup=False)
    return ok
