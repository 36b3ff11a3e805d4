"""Quantized checkpoints in the compressed-tensors format vLLM loads, streamed.

``quantize_checkpoint(model_dir, scheme, out_dir)`` writes ``out_dir`` with the same
shard names as the input, quantized Linear weights (FP8, NVFP4, NVFP4A16, MXFP4,
INT4, INT8), everything else byte-for-byte copied, and config.json's
``quantization_config``.
See docs/quantize.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from onboard.errors import InputError
from onboard.quantize.schemes import SCHEMES, get_scheme

if TYPE_CHECKING:
    from onboard.spec.model import ModelSpec

__all__ = ["SCHEMES", "quantize_checkpoint"]


def own_spec(model_dir: Path, spec: ModelSpec | Path | str | None) -> ModelSpec | None:
    """The spec given, else the checkpoint's own spec.yaml, else None (a checkpoint
    as transformers saved it: its layout is read from its names, see layout.py)."""
    if spec is None:
        spec = Path(model_dir) / "spec.yaml"
        if not spec.is_file():
            return None  # (without importing the schema: see onboard.spec)
    if isinstance(spec, str | Path):
        from onboard.spec import load_spec

        return load_spec(Path(spec))
    return spec


def _check_not_quantized(model_dir: Path, spec: ModelSpec | None, log) -> None:
    """Refuse a checkpoint that is already quantized (before its tensors are
    compared with the spec: a quantized one differs from it everywhere). A spec
    read from a quantized upload (checkpoint.source_quantization) may describe a
    16-bit checkpoint of the same architecture (the tiny one `onboard new-model`
    makes): that is quantized, and the log says so."""
    from onboard.config_json import read_config_json
    from onboard.quantize.selection import refuse_quantized

    config_path = model_dir / "config.json"
    if config_path.is_file():
        refuse_quantized(model_dir, read_config_json(config_path))
    quant = spec.checkpoint.source_quantization if spec is not None else None
    if quant is not None:
        what = " ".join(v for v in (quant.method, quant.algorithm) if v)
        log(
            f"note: the spec's checkpoint.source_quantization says the published "
            f"checkpoint is already quantized ({what}); {model_dir} holds 16-bit "
            "weights (its config.json has no quantization_config), which are "
            "quantized"
        )


def _preflight(spec: ModelSpec, model_dir: Path) -> None:
    """Refuse what `onboard spec check --checkpoint` refuses (but for the config
    keys as transformers reads them: quantize copies those unchanged)."""
    from onboard.checkpoint.preflight import preflight

    report = preflight(spec, model_dir, config_keys=False)
    if not report.ok:
        raise InputError(
            f"{model_dir}: the checkpoint does not match its spec; nothing was "
            "written (`onboard spec check --checkpoint` shows all):\n"
            + "\n".join(line for p in report.errors for line in p.lines())
        )


def inferred_spec(model_dir: Path) -> ModelSpec:
    """The spec `onboard spec from-hf` infers and proves (what calibration's
    reference needs), or, for a model type transformers does not know, reads."""
    from onboard.spec.hf import model_type_of, read_hf_config, transformers_knows

    config, source = read_hf_config(Path(model_dir))
    if not transformers_knows(model_type_of(config, source)):
        from onboard.spec.hf import spec_from_hf_config

        return spec_from_hf_config(config, source=source)
    from onboard.reference.infer import infer_spec

    return infer_spec(config, source=source)[0]


def quantize_checkpoint(
    model_dir: Path,
    scheme: str,
    out_dir: Path,
    *,
    spec: ModelSpec | Path | str | None = None,
    workers: int | None = None,
    include_mtp: bool = False,
    progress: bool = False,
    log=None,
    calibration_samples: int | None = None,
    calibration_seq_len: int | None = None,
    ray: str | None = None,
) -> Path:
    """Quantize the checkpoint in ``model_dir`` with ``scheme`` into ``out_dir``.

    ``out_dir`` must not exist or be empty; it appears (by one rename) only when
    complete. A run interrupted for any reason resumes where it stopped when
    called again with the same arguments. Bad input raises InputError.

    ``ray``: run the work as Ray tasks on the cluster at this address (``auto``,
    ``HOST:PORT``, ``ray://HOST:PORT`` or ``local``; see cluster.py) instead of
    local worker processes; the output is the same, byte for byte.
    """
    from onboard.quantize.ct_import import import_compressed_tensors
    from onboard.quantize.run import execute
    from onboard.quantize.selection import make_selection

    import_compressed_tensors()  # before anything imports it the slow way

    model_dir, out_dir = Path(model_dir), Path(out_dir)
    sch = get_scheme(scheme)
    if not model_dir.is_dir():
        raise InputError(f"{model_dir}: not a directory")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise InputError(f"{out_dir}: exists and is not empty; nothing was written")
    if workers is not None and workers < 1:
        raise InputError(f"--workers must be at least 1, got {workers}")
    if workers is not None and ray is not None:
        raise InputError(
            "--workers is for a local run; with --ray every CPU of the cluster runs "
            "tasks"
        )
    if Path(out_dir).resolve() == Path(model_dir).resolve():
        raise InputError(f"{out_dir}: the output cannot be the input directory")
    if ray is not None:
        from onboard.quantize.cluster import import_ray

        import_ray()  # (before any work: a missing Ray is the user's to fix)
    resolved = own_spec(model_dir, spec)
    _check_not_quantized(model_dir, resolved, log or (lambda msg: None))
    if resolved is not None:
        _preflight(resolved, model_dir)
    selection = make_selection(model_dir, resolved, sch, include_mtp=include_mtp)
    for warning in selection.warnings:
        (log or (lambda msg: None))(f"warning: {warning}")
    if sch.calibrated and include_mtp:
        raise InputError(
            f"--include-mtp: {sch.name} calibrates activations through the "
            "reference model, which has no MTP heads; quantize MTP heads with a "
            "weight-only or dynamic scheme"
        )
    options = {"include_mtp": include_mtp}
    calibration = None
    if sch.calibrated:
        from onboard.quantize import calibrate

        samples = calibration_samples or calibrate.NUM_SAMPLES
        seq_len = calibration_seq_len or calibrate.SEQ_LEN
        options.update(calibration_samples=samples, calibration_seq_len=seq_len)

        def calibration() -> dict[str, float]:
            reference = resolved or inferred_spec(model_dir)
            return calibrate.calibrate(selection, reference, samples, seq_len, log=log)

    log = log or (lambda msg: None)
    cluster = None
    if ray is not None:
        from onboard.quantize.cluster import connect, disconnect

        cluster = connect(ray, log)
    try:
        return execute(
            selection,
            out_dir,
            options=options,
            workers=workers,
            calibration=calibration,
            progress=progress,
            log=log,
            cluster=cluster,
        )
    finally:
        if cluster is not None:
            disconnect()
