"""The `onboard` command line.

Each command is a thin shell around one pipeline stage's public function. Bad input
raises :class:`onboard.errors.InputError` and exits 2 with its message; a failed
check exits 1; nothing prints a traceback for either.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from onboard.errors import CheckFailed, InputError, printable_lines

app = typer.Typer(
    name="onboard",
    help="Day-0 vLLM support for a new LLM architecture from one model spec.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
spec_app = typer.Typer(
    help="Check, infer and describe model specs.", no_args_is_help=True
)
checkpoint_app = typer.Typer(
    help="Write checkpoints for validation.", no_args_is_help=True
)
app.add_typer(spec_app, name="spec")
app.add_typer(checkpoint_app, name="checkpoint")

err = Console(stderr=True, highlight=False, soft_wrap=True)
out = Console(highlight=False, soft_wrap=True)

# Every argument has an upper-case metavar (the usage line names it so).
SpecArg = Annotated[
    Path, typer.Argument(metavar="SPEC", help="Model spec YAML.", show_default=False)
]
OutOpt = Annotated[Path, typer.Option("--out", "-o", help="Output directory.")]


@spec_app.command("check")
def spec_check(
    spec: SpecArg,
    checkpoint: Annotated[
        Path | None,
        typer.Option(help="Also compare this checkpoint's headers and config.json."),
    ] = None,
) -> None:
    """Validate a spec; print every problem as FILE:LINE:COL: field: message."""
    from onboard.spec import load_spec

    loaded = load_spec(spec)
    from onboard.targets.check import check_spec_targets

    # What the spec's targets can only emulate: warnings (exit 0); what cannot run
    # at all raises a located SpecError (exit 2).
    for warning in check_spec_targets(spec, loaded):
        err.print(f"warning: {warning}", markup=False)
    from onboard.spec.hf import transformers_knows
    from onboard.spec.loader import Problem, spec_locator
    from onboard.spec.rules import reference_tree_problem

    tree = reference_tree_problem(loaded)
    if tree is not None and not transformers_knows(loaded.model_type):
        # generate writes hf/README.md with this reason instead of a reference.
        line, col = spec_locator(spec)(tree[0])
        where = ".".join(map(str, tree[0]))
        text = f"no Hugging Face reference will be generated: {tree[1]}"
        err.print(
            f"warning: {Problem(str(spec), line, col, where, text)}", markup=False
        )
    if checkpoint is not None:
        from onboard.checkpoint.preflight import preflight

        report = preflight(loaded, checkpoint)
        for line in report.lines():
            out.print(line, markup=False)
        if not report.ok:
            raise InputError(f"{checkpoint}: checkpoint does not match the spec")
    from onboard.spec.rules import tensor_parallel_note

    out.print(f"note: {spec}: {tensor_parallel_note(loaded)}", markup=False)
    out.print(
        f"{spec}: ok ({loaded.architecture}, {loaded.num_hidden_layers} layers)",
        markup=False,
    )


@spec_app.command("schema")
def spec_schema() -> None:
    """Print the spec's JSON Schema (for editor autocompletion)."""
    from onboard.spec.model import ModelSpec

    print(json.dumps(ModelSpec.model_json_schema(), indent=2))


@spec_app.command("from-hf")
def spec_from_hf(
    config: Annotated[
        Path,
        typer.Argument(
            metavar="CONFIG", help="config.json, or a directory containing one."
        ),
    ],
    output: Annotated[Path, typer.Option("--output", "-o", help="Spec YAML to write.")],
    name: Annotated[
        str | None, typer.Option(help="Spec name (default: from model_type).")
    ] = None,
    verify: Annotated[
        bool,
        typer.Option(
            help="Prove the spec: the reference generated for it must give the "
            "logits of transformers' own class on a tiny random model of the family."
        ),
    ] = True,
    trust_remote_code: Annotated[
        bool,
        typer.Option(
            help="For a model type transformers does not ship, prove against the "
            "family's own code that the config's auto_map names, from the config's "
            "directory (this runs that code)."
        ),
    ] = False,
) -> None:
    """Infer a spec from a Hugging Face config.json, and prove it against
    transformers' class for the family (or the family's own code)."""
    from onboard.fsutil import atomic_write_text, check_output_file, same_file
    from onboard.reference.from_hf import infer_from_hf
    from onboard.spec import dump_spec
    from onboard.spec.hf import read_hf_config

    source = config / "config.json" if config.is_dir() else config
    if same_file(output, source):
        raise InputError(
            f"--output {output}: is the input {source}; writing the spec there would "
            "destroy the config (choose another file, e.g. spec.yaml)"
        )
    check_output_file(output)
    data, where = read_hf_config(config)
    header, spec = infer_from_hf(
        data,
        where,
        name=name,
        verify=verify,
        trust_remote_code=trust_remote_code,
        log=lambda msg: err.print(msg, markup=False),
    )
    try:
        atomic_write_text(output, header + dump_spec(spec))
    except OSError as exc:  # e.g. a full disk: the user's to fix
        raise InputError(f"{output}: cannot write the spec: {exc}") from None
    out.print(f"wrote {output} ({spec.architecture})", markup=False)


@checkpoint_app.command("tiny")
def checkpoint_tiny(
    spec: SpecArg,
    out_dir: OutOpt,
    seed: Annotated[int, typer.Option(help="Random seed for the weights.")] = 0,
    train_mtp: Annotated[
        bool,
        typer.Option(
            help="Train the spec's MTP heads by self-distillation (about a minute "
            "of CPU), so that speculative decoding with them accepts tokens."
        ),
    ] = True,
    mtp_steps: Annotated[
        int | None, typer.Option(help="MTP training steps (default 200).")
    ] = None,
) -> None:
    """Write a seconds-sized random checkpoint of the spec's architecture."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.spec import load_spec
    from onboard.speculators.mtp_train import head_trainer

    trainer = head_trainer(
        steps=mtp_steps,
        seed=seed,
        log=lambda line: out.print(f"  {line}", markup=False),
    )
    path = write_tiny_checkpoint(
        load_spec(spec),
        out_dir,
        seed=seed,
        finish=trainer if train_mtp else None,
    )
    out.print(f"wrote tiny checkpoint to {path}")


StandaloneOpt = Annotated[
    bool,
    typer.Option(
        "--standalone",
        help="Write the whole model files even where the spec is a family vLLM "
        "ships (by default such a spec's files subclass the family's classes).",
    ),
]


@app.command("generate")
def generate(spec: SpecArg, out_dir: OutOpt, standalone: StandaloneOpt = False) -> None:
    """Render the vLLM model file, its plugin and (new model types) the HF reference."""
    from onboard.fsutil import check_output_dir
    from onboard.pipeline.generate import generate_all
    from onboard.spec import load_spec

    loaded = load_spec(spec)
    check_output_dir(out_dir)
    try:
        written = generate_all(loaded, out_dir, standalone)
    except OSError as exc:  # e.g. a full disk: the user's to fix
        raise InputError(
            f"{out_dir}: cannot write the generated files: {exc}"
        ) from None
    for path in written:
        out.print(f"wrote {path}", markup=False)


class _OptionalValueCommand(typer.core.TyperCommand):
    """`--ray` alone (`--ray auto`) or `--ray ADDRESS`: the next argument is taken
    as the address only when it looks like one (``auto``, ``local``,
    ``ray://...``, ``HOST:PORT``), so `--ray MODEL_DIR ...` still reads MODEL_DIR
    as the checkpoint."""

    def parse_args(self, ctx, args):
        out = []
        for i, arg in enumerate(args):
            out.append(arg)
            if arg == "--ray":
                nxt = args[i + 1] if i + 1 < len(args) else None
                if nxt is None or not _looks_like_ray_address(nxt):
                    out.append("auto")
        return super().parse_args(ctx, out)

    def collect_usage_pieces(self, ctx) -> list[str]:
        # As _Command below: `MODEL_DIR`, not typer's `{MODEL_DIR}`.
        pieces = super().collect_usage_pieces(ctx)
        return [p.removeprefix("{").removesuffix("}") for p in pieces]


def _looks_like_ray_address(arg: str) -> bool:
    import re

    return arg in ("auto", "local") or bool(
        re.fullmatch(r"ray://\S+|\[?[\w.:-]*\]?:\d+", arg)
    )


@app.command("quantize", cls=_OptionalValueCommand)
def quantize(
    model_dir: Annotated[
        Path,
        typer.Argument(
            metavar="MODEL_DIR", help="16-bit checkpoint directory.", show_default=False
        ),
    ],
    scheme: Annotated[
        str,
        typer.Option(
            help="fp8-dynamic, fp8-block, nvfp4, nvfp4a16, mxfp4, w4a16, w4a16-asym "
            "or w8a8-int8."
        ),
    ],
    out_dir: OutOpt,
    spec: Annotated[
        Path | None,
        typer.Option(
            help="Model spec (default: MODEL_DIR/spec.yaml, else the layout is read "
            "from the checkpoint's tensor names and config.json)."
        ),
    ] = None,
    workers: Annotated[
        int | None, typer.Option(help="Parallel shard workers (default: cores).")
    ] = None,
    include_mtp: Annotated[
        bool, typer.Option(help="Also quantize the MTP heads.")
    ] = False,
    ray: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="Run the tasks on a Ray cluster's nodes: `--ray` alone joins "
            "RAY_ADDRESS or the cluster this machine is a node of; ADDRESS is "
            "HOST:PORT, ray://HOST:PORT or `local`. MODEL_DIR and --out must be on "
            "storage every node mounts at the same path (docs/quantize.md).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Quantize a checkpoint into the compressed-tensors format vLLM loads."""
    from onboard.fsutil import check_output_dir
    from onboard.quantize import quantize_checkpoint

    check_output_dir(out_dir, must_be_empty=True)

    path = quantize_checkpoint(
        model_dir,
        scheme,
        out_dir,
        spec=spec,
        workers=workers,
        include_mtp=include_mtp,
        progress=True,
        log=lambda msg: err.print(msg, markup=False),
        ray=ray,
    )
    out.print(f"wrote {scheme} checkpoint to {path}")
    if _STANDALONE:
        # The output is complete and on disk: skip the interpreter's teardown of
        # torch & co (~0.5-0.7 s of a ~5 s run, docs/benchmarks.md).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


class _SpeculatorsGroup(typer.core.TyperGroup):
    """`onboard speculators SPEC --out DIR` (the `write` command) beside
    `onboard speculators tune ...`: arguments that name no subcommand go to
    `write`."""

    def parse_args(self, ctx, args):
        if args and args[0] not in self.commands and args[0] != "--help":
            args = ["write", *args]
        return super().parse_args(ctx, args)


speculators_app = typer.Typer(
    cls=_SpeculatorsGroup,
    help="Speculative decoding: configs, drafts, draft-length tuning.",
    no_args_is_help=True,
)
app.add_typer(speculators_app, name="speculators")


@speculators_app.command("write")
def speculators(spec: SpecArg, out_dir: OutOpt) -> None:
    """Write vLLM --speculative-config files, draft-head configs and training
    recipes for every speculative method the spec lists (the default command)."""
    from onboard.spec import load_spec
    from onboard.speculators import write_speculators

    for path in write_speculators(load_spec(spec), out_dir, source=str(spec)):
        out.print(f"wrote {path}", markup=False)


@speculators_app.command("tune")
def speculators_tune(
    model_dir: Annotated[
        Path, typer.Argument(metavar="MODEL_DIR", help="Checkpoint directory.")
    ],
    spec: Annotated[Path, typer.Option("--spec", help="Model spec YAML.")],
    out_dir: OutOpt,
    methods: Annotated[
        str | None,
        typer.Option(help="Comma-separated methods (default: the spec's list)."),
    ] = None,
    speculators_dir: Annotated[
        Path | None,
        typer.Option("--speculators", help="Trained heads (DIR/speculators)."),
    ] = None,
    generated: Annotated[
        Path | None,
        typer.Option(help="Output of `onboard generate` (default: vLLM's classes)."),
    ] = None,
) -> None:
    """Measure acceptance and draft cost, predict and measure the speed-up of draft
    lengths 1-4 per method and batch band, pick the best (or decline)."""
    from onboard.fsutil import INDEX_FILE, read_weight_map
    from onboard.runtime.engine import read_plugin
    from onboard.spec import load_spec
    from onboard.spec.model import SPEC_METHODS
    from onboard.speculators.tune import tune

    loaded = load_spec(spec)
    names = (
        [m.strip() for m in methods.split(",") if m.strip()]
        if methods
        else [s.method for s in loaded.speculators]
    )
    for name in names:
        if name not in SPEC_METHODS:
            raise InputError(f"--methods: unknown method {name!r}")
    if not names:
        raise InputError(f"{spec}: the spec lists no speculative method")
    if not Path(model_dir, "config.json").is_file():
        raise InputError(f"{model_dir}: no config.json (not a checkpoint)")
    if Path(model_dir, INDEX_FILE).is_file():
        read_weight_map(Path(model_dir, INDEX_FILE))  # the engine opens what it names
    plugin = read_plugin(generated / "plugin") if generated else None
    report = tune(
        model_dir,
        loaded,
        names,
        out_dir,
        speculators_dir=speculators_dir,
        plugin=plugin,
        log=lambda line: err.print(line, markup=False),
    )
    for method, result in report["methods"].items():
        for band, data in result["bands"].items():
            out.print(f"{method} {band}: {data['decision']}", markup=False)
    out.print(f"wrote {out_dir / 'tune.json'} and {out_dir / 'tune.md'}")


@app.command("new-model")
def new_model(
    spec: SpecArg,
    out_dir: OutOpt,
    stages: Annotated[
        str | None,
        typer.Option(help="Comma-separated stages to run (default: all that exist)."),
    ] = None,
    force: Annotated[
        bool, typer.Option(help="Rerun stages even when their inputs did not change.")
    ] = False,
    full: Annotated[
        bool, typer.Option(help="Exhaustive sweeps instead of the quick default run.")
    ] = False,
    checks: Annotated[
        str | None,
        typer.Option(
            help="Comma-separated validation checks (default: every check the spec "
            "calls for: accuracy, kv-cache, quant:*, spec-decode:*, "
            "tensor-parallel, speed)."
        ),
    ] = None,
    standalone: StandaloneOpt = False,
) -> None:
    """Run the whole pipeline for a spec into OUT."""
    from onboard.pipeline import run_pipeline

    selected = [s.strip() for s in stages.split(",") if s.strip()] if stages else None
    chosen = [c.strip() for c in checks.split(",") if c.strip()] if checks else None
    ok = run_pipeline(
        spec,
        out_dir,
        stages=selected,
        force=force,
        full=full,
        checks=chosen,
        console=out,
        standalone=standalone,
    )
    if not ok:
        raise CheckFailed(
            "a stage failed, or validation did not pass (see validation.json)"
        )


@app.command("validate")
def validate(
    model_dir: Annotated[
        Path | None,
        typer.Argument(
            metavar="MODEL_DIR",
            help="Checkpoint directory (with --emit: also a Hub id).",
        ),
    ] = None,
    spec: Annotated[
        Path | None, typer.Option("--spec", help="Model spec YAML.")
    ] = None,
    out_dir: Annotated[
        Path | None, typer.Option("--out", "-o", help="Output directory.")
    ] = None,
    target: Annotated[
        str, typer.Option(help="Hardware target (cpu runs here).")
    ] = "cpu",
    generated: Annotated[
        Path | None,
        typer.Option(help="Output of `onboard generate` (default: generate afresh)."),
    ] = None,
    checks: Annotated[
        str, typer.Option(help="Comma-separated checks, e.g. accuracy,kv-cache.")
    ] = "accuracy",
    vllm_in_tree: Annotated[
        bool,
        typer.Option(
            "--reference-vllm-in-tree",
            hidden=True,
            help="Load vLLM's own in-tree class instead of the generated one "
            "(baselines and benchmarks).",
        ),
    ] = False,
    installed_plugin: Annotated[
        bool,
        typer.Option(
            "--installed-plugin",
            help="Load the plugin as `pip install GEN_DIR/plugin` installed it in "
            "this Python environment, instead of the generated code.",
        ),
    ] = False,
    preflight: Annotated[
        bool,
        typer.Option(
            "--preflight/--no-preflight",
            hidden=True,
            help="Check the checkpoint's headers against the spec first (default); "
            "--no-preflight lets the engine meet a mismatched checkpoint.",
        ),
    ] = True,
    quantized: Annotated[
        list[str] | None,
        typer.Option(
            "--quantized",
            metavar="SCHEME=DIR",
            help="A quantized checkpoint of MODEL_DIR to compare with it "
            "(runs the quant:SCHEME check); repeatable.",
        ),
    ] = None,
    speculators_dir: Annotated[
        Path | None,
        typer.Option(
            "--speculators",
            help="Output of the speculators stage (DIR/speculators): the trained "
            "draft heads the spec-decode checks serve.",
        ),
    ] = None,
    emit: Annotated[
        Path | None,
        typer.Option(
            help="GPU targets: write the run script and thresholds to DIR "
            "instead of running (docs/validation.md)."
        ),
    ] = None,
    ingest: Annotated[
        Path | None,
        typer.Option(
            help="Read back the results of an emitted run (DIR) into "
            "OUT/TARGET/validation.json."
        ),
    ] = None,
    disaggregate: Annotated[
        str | None,
        typer.Option(
            help="With --emit: serve the prefill/decode layout of `onboard plan "
            "--disaggregate P:D` (run.sh ROLE=prefill|decode and its proxy phase).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Run MODEL_DIR on the real vLLM engine through the generated code and compare
    it with the reference; write OUT/validation.json and OUT/report.html. With
    --emit / --ingest: write what to run on a GPU target, or read its results."""
    from onboard.report.data import verdict_lines
    from onboard.validate import validate as run_validate

    if disaggregate is not None and emit is None:
        raise InputError("validate: --disaggregate P:D goes with --emit DIR")
    if emit is not None or ingest is not None:
        _validate_remote(
            model_dir, spec, target, out_dir, generated, emit, ingest, disaggregate
        )
        return
    missing = [
        name
        for name, value in (
            ("MODEL_DIR", model_dir),
            ("--spec", spec),
            ("--out", out_dir),
        )
        if value is None
    ]
    if missing:
        raise InputError(
            f"validate: missing {', '.join(missing)} (a run needs MODEL_DIR, --spec "
            "and --out)"
        )

    variants = _quantized_option(quantized or [])
    checks = ",".join([checks, *(f"quant:{s}" for s in variants)])
    result = run_validate(
        model_dir,
        spec,
        target,
        out_dir,
        generated=generated,
        checks=checks,
        quantized=variants,
        speculators_dir=speculators_dir,
        vllm_in_tree=vllm_in_tree,
        installed_plugin=installed_plugin,
        preflight=preflight,
        log=lambda line: err.print(line, markup=False),
    )
    for check in result.checks:
        out.print(f"{check.name}: {check.status}", markup=False)
        if check.status != "passed" and check.details:
            out.print(check.details, markup=False)
    out.print(f"wrote {out_dir / 'validation.json'} and {out_dir / 'report.html'}")
    out.print(*verdict_lines(result), sep="\n", markup=False)
    if not result.passed:
        raise CheckFailed(
            f"validation did not pass (see {out_dir / 'validation.json'})"
        )


def _validate_remote(
    model, spec, target, out_dir, generated, emit, ingest, disaggregate=None
) -> None:
    """`validate --emit DIR` (needs MODEL and --spec) or `--ingest DIR --out OUT`."""
    if emit is not None and ingest is not None:
        raise InputError("validate: --emit and --ingest exclude each other")
    if emit is not None:
        from onboard.validate.emit import emit as run_emit

        if model is None or spec is None:
            raise InputError("validate --emit: MODEL and --spec are required")
        run_emit(
            str(model),
            spec,
            target,
            emit,
            generated=generated,
            disaggregate=disaggregate,
        )
        out.print(f"wrote {emit}/run.sh and {emit}/thresholds.json", markup=False)
        run_sh = shlex.quote(str(emit / "run.sh"))
        out.print(f"run on {target}: bash {run_sh}", markup=False)
        return
    from onboard.report.data import verdict_lines
    from onboard.validate.ingest import ingest as run_ingest

    if out_dir is None:
        raise InputError("validate --ingest: --out is required")
    result, where = run_ingest(target, ingest, out_dir)
    for check in result.checks:
        out.print(f"{check.name}: {check.status}", markup=False)
        if check.status != "passed" and check.details:
            out.print(check.details, markup=False)
    out.print(f"wrote {where / 'validation.json'}", markup=False)
    out.print(*verdict_lines(result), sep="\n", markup=False)
    if not result.passed:
        raise CheckFailed(f"validation did not pass (see {where / 'validation.json'})")


def _quantized_option(values: list[str]) -> dict[str, Path]:
    variants = {}
    for value in values:
        scheme, sep, path = value.partition("=")
        if not sep or not scheme or not path:
            raise InputError(f"--quantized: expected SCHEME=DIR, got {value!r}")
        if not Path(path).is_dir():
            raise InputError(f"--quantized: {path}: no such directory")
        variants[scheme] = Path(path)
    return variants


@app.command("publish")
def publish(
    model_dir: Annotated[
        Path,
        typer.Argument(
            metavar="MODEL_DIR", help="Checkpoint directory written by onboard."
        ),
    ],
    repo: Annotated[str, typer.Option(help="Hub repository, ORG/NAME.")],
    private: Annotated[
        bool, typer.Option(help="Create the repository private (refuse a public one).")
    ] = False,
    revision: Annotated[
        str, typer.Option(help="Branch to commit to or open the pull request on.")
    ] = "main",
    endpoint: Annotated[
        str | None, typer.Option(help="Hub URL (default: HF_ENDPOINT or the Hub).")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option(help="Print the files, sizes and card; touch nothing.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            help="Publish despite failed or missing validation (the card says so)."
        ),
    ] = False,
    validation: Annotated[
        Path | None,
        typer.Option(help="validation.json (default: the new-model layout's)."),
    ] = None,
    pr: Annotated[
        bool, typer.Option("--pr/--no-pr", help="Open a pull request (default).")
    ] = True,
    base_model: Annotated[
        str | None,
        typer.Option(help="Base model repo for the card (default: the spec's)."),
    ] = None,
    license: Annotated[
        str | None,
        typer.Option(
            "--license",
            help="The weights' licence id for the card (default: the spec's "
            "`license`; one of the two is required).",
        ),
    ] = None,
) -> None:
    """Upload a checkpoint and its model card to the Hugging Face Hub, verified."""
    from onboard.publish import publish as run_publish

    def show(upload) -> None:
        for line in upload.lines():
            out.print(line, markup=False)
        if dry_run:
            out.print("--- README.md (model card) ---", markup=False)
            out.print(upload.card, markup=False, end="")

    report = run_publish(
        model_dir,
        repo,
        endpoint=endpoint,
        private=private,
        revision=revision,
        pull_request=pr,
        dry_run=dry_run,
        force=force,
        validation=validation,
        base_model=base_model,
        license=license,
        log=lambda line: err.print(line, markup=False),
        on_prepared=show,
    )
    outcome = report.outcome
    if outcome is None:
        out.print("dry run: nothing was uploaded", markup=False)
        return
    for note in outcome.notes:
        out.print(note, markup=False)
    if outcome.extra_remote:
        out.print(
            f"also on {outcome.ref} (not from this checkpoint): "
            + ", ".join(outcome.extra_remote),
            markup=False,
        )
    where = outcome.pr_url or f"{outcome.repo_url} ({outcome.ref})"
    again = " (found from an earlier run)" if outcome.reused else ""
    out.print(f"published{again}: {where}", markup=False)
    out.print(
        f"verified {outcome.verified} files against local checksums at {outcome.ref}",
        markup=False,
    )


@app.command("targets")
def targets(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List the hardware target profiles (onboard/targets/profiles.yaml)."""
    from onboard.targets import SCHEMES, load_profiles

    profiles = load_profiles()
    if as_json:
        print(json.dumps({n: p.model_dump() for n, p in profiles.items()}, indent=2))
        return
    from rich.table import Table

    table = Table(title="onboard hardware targets (vLLM 0.32)")
    for column in (
        "target",
        "arch",
        "memory",
        "FP8",
        "native",
        "emulated",
        "no path",
        "attention / MLA / MoE",
        "env",
        "vLLM",
    ):
        table.add_column(column, overflow="fold")
    for name, p in profiles.items():
        memory = "host RAM"
        if p.memory_gb is not None:
            memory = f"{p.memory_gb:g} GB x {p.devices_per_node}"
            if p.scale_up_devices > p.devices_per_node:
                memory += f" (NVLink {p.scale_up_devices})"
        by_level = {
            level: ", ".join(
                s + (" (not MoE)" if p.schemes[s].level(True) != level else "")
                for s in SCHEMES
                if p.schemes[s].support == level
            )
            for level in ("native", "emulated", "unsupported")
        }
        b = p.backends
        table.add_row(
            name,
            p.arch.split()[0],
            memory,
            p.fp8_dtype.removeprefix("float8_"),
            by_level["native"],
            by_level["emulated"],
            by_level["unsupported"],
            f"{b.attention_name} / {b.mla_name} / {b.moe.split()[0]}",
            " ".join(f"{k}={v}" for k, v in p.env.items() if not v.startswith("<")),
            p.vllm.package,
        )
    # Piped output gets a table wide enough to read; a terminal keeps its width.
    console = out if out.is_terminal else Console(width=180, highlight=False)
    console.print(table)


@app.command("plan")
def plan(
    spec: SpecArg,
    target: Annotated[str, typer.Option(help="Hardware target (`onboard targets`).")],
    scheme: Annotated[
        str,
        typer.Option(
            help="bf16, fp8-dynamic, fp8-block, nvfp4, nvfp4a16, mxfp4, w4a16, "
            "w4a16-asym, w8a8-int8."
        ),
    ] = "bf16",
    context: Annotated[
        int | None,
        typer.Option(help="Tokens per request (default: max_position_embeddings)."),
    ] = None,
    concurrency: Annotated[int, typer.Option(help="Requests served at once.")] = 1,
    dtype: Annotated[
        str, typer.Option(help="Serving dtype: bfloat16, float16 or float32.")
    ] = "bfloat16",
    kv_cache_dtype: Annotated[str, typer.Option(help="auto or fp8.")] = "auto",
    output_len: Annotated[
        int | None,
        typer.Option(help="Output tokens per request (default min(1024, N/2))."),
    ] = None,
    model: Annotated[
        str | None, typer.Option(help="Model path or Hub id for the command line.")
    ] = None,
    nodes: Annotated[
        int | None,
        typer.Option(
            help="Serve on exactly this many nodes of the target, through a Ray "
            "cluster (vLLM's multi-node TP/PP/DP/EP): the Ray and vllm serve "
            "commands.",
            show_default=False,
        ),
    ] = None,
    disaggregate: Annotated[
        str | None,
        typer.Option(
            help="P:D: prefill/decode disaggregation (NIXL) with P prefill and D "
            "decode nodes (P + D = --nodes): the layout of each side, the numbers "
            "that size it, the commands and the proxy.",
            show_default=False,
        ),
    ] = None,
    link_gbps: Annotated[
        float | None,
        typer.Option(
            help="With --disaggregate: scale-out network per node, GB/s "
            "(gigabytes), that the KV cache crosses.",
            show_default=False,
        ),
    ] = None,
    device_tflops: Annotated[
        float | None,
        typer.Option(
            help="With --disaggregate: dense TFLOPS of one device in the serving "
            "format (prefill estimate).",
            show_default=False,
        ),
    ] = None,
    hbm_tbps: Annotated[
        float | None,
        typer.Option(
            help="With --disaggregate: memory bandwidth of one device, TB/s "
            "(decode estimate).",
            show_default=False,
        ),
    ] = None,
    node_gbps: Annotated[
        float | None,
        typer.Option(
            help="Predict `onboard quantize --ray` of the spec's 16-bit checkpoint "
            "with --scheme on --nodes nodes (default 1), each processing this many "
            "GB/s (gigabytes) of it (its storage or network share, or its cores).",
            show_default=False,
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Plan serving SPEC on TARGET: weights, KV cache, layout, capacity, command."""
    from onboard.serving import make_deployment
    from onboard.serving.disagg import Figures
    from onboard.serving.quantize_time import quantize_time
    from onboard.serving.render import render_deployment
    from onboard.spec import load_spec

    loaded = load_spec(spec)
    figures = Figures(link_gbps, device_tflops, hbm_tbps)
    result = make_deployment(
        loaded,
        target,
        scheme,
        context=context,
        concurrency=concurrency,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        output_len=output_len,
        model=model,
        nodes=nodes,
        disaggregate=disaggregate,
        figures=figures,
    )
    if node_gbps is not None:
        result.quantize_time = quantize_time(loaded, scheme, nodes or 1, node_gbps)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        out.print(render_deployment(result), markup=False)
    if result.chosen is None:
        raise CheckFailed(
            f"no layout of up to {result.candidates[-1].layout.devices} {target} "
            "devices holds the model and the requested KV cache"
        )


pr_app = typer.Typer(
    help="Apply the PR-ready vLLM tree (DIR/vllm-pr) to a vLLM source tree.",
    no_args_is_help=True,
)
app.add_typer(pr_app, name="pr")
GenDirArg = Annotated[
    Path, typer.Argument(metavar="GEN_DIR", help="Output of `onboard generate`.")
]
VllmSrcOpt = Annotated[
    Path,
    typer.Option(
        "--vllm-src", help="Directory containing vllm/ (checkout or site-packages)."
    ),
]


@pr_app.command("check")
def pr_check(gen_dir: GenDirArg, vllm_src: VllmSrcOpt) -> None:
    """Dry-run GEN_DIR/vllm-pr/changes.patch against the vLLM tree."""
    from onboard.pr.apply import check

    out.print(check(gen_dir, vllm_src).summary("would change"), markup=False)


@pr_app.command("apply")
def pr_apply(gen_dir: GenDirArg, vllm_src: VllmSrcOpt) -> None:
    """Apply the PR to the vLLM tree (refused when it would not apply cleanly)."""
    from onboard.pr.apply import apply

    out.print(apply(gen_dir, vllm_src).summary("changed"), markup=False)


@pr_app.command("describe")
def pr_describe(
    gen_dir: GenDirArg,
    spec: Annotated[Path, typer.Option("--spec", help="Model spec YAML.")],
    validation: Annotated[
        Path | None, typer.Option(help="validation.json whose numbers PR.md quotes.")
    ] = None,
) -> None:
    """Rewrite GEN_DIR/vllm-pr/PR.md with the numbers of a validation.json."""
    from onboard.pipeline.generate import write_pr_md

    out.print(f"wrote {write_pr_md(spec, gen_dir, validation)}", markup=False)


class _Command(typer.core.TyperCommand):
    """Usage lines in Click's convention, `onboard generate [OPTIONS] SPEC`: typer
    itself writes a required argument as `{SPEC}`."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        pieces = super().collect_usage_pieces(ctx)
        return [p.removeprefix("{").removesuffix("}") for p in pieces]


for _app in (app, spec_app, checkpoint_app, speculators_app, pr_app):
    for _info in _app.registered_commands:
        if _info.cls is typer.core.TyperCommand:
            _info.cls = _Command

_STANDALONE = False  # run as the `onboard` program (not in-process, e.g. tests)


def main() -> None:
    global _STANDALONE
    _STANDALONE = True
    # Click handles usage errors itself (exit 2); ours are turned into exit codes here.
    try:
        app()
    except InputError as exc:
        # Messages quote the user's input: print its control characters escaped.
        err.print(f"error: {printable_lines(str(exc))}", markup=False)
        sys.exit(2)
    except CheckFailed as exc:
        err.print(f"failed: {printable_lines(str(exc))}", markup=False)
        sys.exit(1)
