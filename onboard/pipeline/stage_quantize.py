"""The `new-model` quantize stage: DIR/checkpoints/bf16 -> DIR/checkpoints/<scheme>.

One `onboard quantize` per scheme the spec lists (progress bar on stderr). A
finished output is reused when it was made from the same bf16 files (names, sizes,
modification times) by the same quantizer code (a hash of onboard/quantize's
sources), recorded in DIR/.onboard/quantize-<scheme>.json; a stale one is replaced. An
interrupted run resumes inside `onboard quantize` itself (its
partial directory), and the validate stage's `quant:<scheme>` checks read these
directories.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from onboard.fsutil import atomic_write_text


def _inputs(bf16) -> dict[str, list[int]]:
    return {
        p.name: [p.stat().st_size, p.stat().st_mtime_ns]
        for p in sorted(bf16.iterdir())
        if p.is_file()
    }


def quantizer_code() -> str:
    """Which quantizer made an output: a changed plan or kernel must not reuse it."""
    import onboard.quantize

    digest = hashlib.sha256()
    for source in sorted(Path(onboard.quantize.__file__).parent.glob("*.py")):
        digest.update(source.name.encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()


def run(ctx) -> None:
    from onboard.quantize import quantize_checkpoint

    bf16 = ctx.checkpoints / "bf16"
    for scheme in ctx.spec.quantization:
        out = ctx.checkpoints / scheme
        stamp_file = ctx.out / ".onboard" / f"quantize-{scheme}.json"
        stamp = {
            "scheme": scheme,
            "inputs": _inputs(bf16),
            "quantizer": quantizer_code(),
        }
        if (out / "onboard-quantize.json").is_file() and stamp_file.is_file():
            if json.loads(stamp_file.read_text()) == stamp:
                ctx.console.print(f"  {scheme}: {out} is up to date, reused")
                continue
        if out.exists():
            shutil.rmtree(out)  # made from other bf16 files: stale
        ctx.console.print(f"  {scheme}: quantizing {bf16} -> {out}")
        quantize_checkpoint(
            bf16,
            scheme,
            out,
            spec=bf16 / "spec.yaml" if (bf16 / "spec.yaml").is_file() else ctx.spec,
            progress=True,
            log=lambda line: ctx.console.print(f"    {line}", markup=False),
        )
        stamp_file.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(stamp_file, json.dumps(stamp, indent=2))
