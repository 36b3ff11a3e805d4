"""Preflight of the checkpoint's files: the index, the shards and their headers.

Reads the 8-byte length and the JSON header of every shard, never tensor data, and
checks the index against the shards on disk (missing, unlisted, truncated or
corrupt shards, tensors the index misplaces). Also the hint that points at the
checkpoint's own ``spec.yaml`` when many sizes disagree.
"""

from __future__ import annotations

import shlex
from collections import Counter
from pathlib import Path

from onboard import safetensors_header
from onboard.checkpoint.preflight_report import PreflightRun, TensorInfo, examples
from onboard.checkpoint.tiny import INDEX_FILE
from onboard.errors import InputError
from onboard.fsutil import BadIndex, read_weight_map
from onboard.safetensors_header import HeaderError

# Size mismatches from which preflight looks for the checkpoint's own spec.yaml.
SPEC_HINT_MISMATCHES = 3


def read_header(path: Path) -> tuple[dict[str, tuple[str, tuple[int, ...]]], int, int]:
    """A safetensors file's tensors as ``{name: (dtype, shape)}`` in file order,
    the bytes read (8 + header length) and the data bytes the header declares;
    :class:`HeaderError` on a truncated or corrupt file."""
    header = safetensors_header.read_header(path)
    tensors = {t.name: (t.dtype, t.shape) for t in header.tensors}
    return tensors, header.data_start, header.data_bytes


def read_shards(run: PreflightRun) -> None:
    """Every shard's header into ``run.found``; the index checked against them."""
    weight_map = _read_index(run)
    on_disk = sorted(p.name for p in run.root.glob("*.safetensors"))
    listed = sorted(set(weight_map.values())) if weight_map else on_disk
    if not listed:
        run.add(
            "error",
            "missing-shard",
            str(run.root),
            "no .safetensors files",
            "download the weights (safetensors)",
        )
        return
    bad = _read_headers(run, listed, weight_map)
    if weight_map is not None:
        _check_index(run, weight_map, on_disk, listed, bad)


def _read_index(run: PreflightRun) -> dict[str, str] | None:
    """The index's weight map; None without an index or with one not trusted."""
    index_path = run.root / INDEX_FILE
    weight_map: dict[str, str] | None = None
    if index_path.is_file():
        try:
            weight_map = read_weight_map(index_path)
        except BadIndex as exc:
            # Without a trusted index only the shards on disk are read: a name
            # with a path in it is never opened.
            run.add(
                "error",
                "index",
                INDEX_FILE,
                exc.problem,
                "regenerate or re-download the index (shards are plain file "
                "names beside it); the shards on disk are checked without it",
            )
            weight_map = None
    return weight_map


def _read_headers(
    run: PreflightRun, listed: list[str], weight_map: dict[str, str] | None
) -> set[str]:
    """Reads the listed shards' headers; returns the shards missing or unreadable."""
    bad: set[str] = set()
    counts = Counter((weight_map or {}).values())
    for shard in listed:
        path = run.root / shard
        if not path.is_file():
            bad.add(shard)
            run.add(
                "error",
                "missing-shard",
                shard,
                f"the index lists it ({counts[shard]} tensors), but it is not on disk",
                "download or copy the missing shard: the checkpoint is incomplete",
            )
            continue
        try:
            tensors, nread, ndata = read_header(path)
        except HeaderError as exc:
            bad.add(shard)
            run.add(
                "error",
                "corrupt-shard",
                shard,
                str(exc),
                "re-download the shard (an interrupted download or copy truncates it)",
            )
            continue
        run.report.shards += 1
        run.report.header_bytes += nread
        run.report.data_bytes += ndata
        for name, (dtype, shape) in tensors.items():
            if name in run.found:
                run.add(
                    "error",
                    "index",
                    name,
                    f"stored twice, in {run.found[name].shard} and {shard}",
                    "keep one copy: which one vLLM loads is undefined",
                    tensors=[name],
                )
            run.found[name] = TensorInfo(dtype, shape, shard)
    run.report.tensors = len(run.found)
    return bad


def _check_index(
    run: PreflightRun,
    weight_map: dict[str, str],
    on_disk: list[str],
    listed: list[str],
    bad: set[str],
) -> None:
    """The index against the shards on disk and the tensors their headers hold."""
    # The tensors of a missing or unreadable shard are not reported again as missing.
    run.lost = {t for t, s in weight_map.items() if s in bad}
    for shard in sorted(set(on_disk) - set(listed)):
        run.add(
            "warning",
            "unindexed-shard",
            shard,
            "on disk but not in the index: vLLM and transformers load only the "
            "shards the index lists, so its tensors are ignored",
            f"add its tensors to {INDEX_FILE} or delete the file",
        )
    elsewhere, nowhere = [], []
    for name, shard in weight_map.items():
        info = run.found.get(name)
        if shard in bad or (info is not None and info.shard == shard):
            continue
        (elsewhere if info is not None else nowhere).append(name)
    if nowhere:
        run.add(
            "error",
            "index",
            INDEX_FILE,
            f"lists {len(nowhere)} tensor(s) that no shard holds, e.g. "
            f"{examples(nowhere)}",
            "re-download the shards (or regenerate the index): loaders "
            "trusting the index fail on these",
            tensors=nowhere,
        )
    if elsewhere:
        run.add(
            "warning",
            "index",
            INDEX_FILE,
            f"puts {len(elsewhere)} tensor(s) in the wrong shard, e.g. "
            f"{examples(elsewhere)}",
            "regenerate the index",
            tensors=elsewhere,
        )
    unlisted = [t for t in run.found if t not in weight_map]
    if unlisted:
        run.add(
            "warning",
            "index",
            INDEX_FILE,
            f"does not list {len(unlisted)} tensor(s) its shards hold, e.g. "
            f"{examples(unlisted)}",
            "regenerate the index",
            tensors=unlisted,
        )


def suggest_own_spec(run: PreflightRun) -> None:
    """Many size mismatches usually mean the wrong spec: point at the spec.yaml
    written with the checkpoint (`onboard checkpoint tiny`, `new-model`) when
    that one has the config's sizes."""
    mismatches = [
        p for p in run.report.errors if p.kind in ("shape", "config", "layer-count")
    ]
    if len(mismatches) < SPEC_HINT_MISMATCHES or run.config is None:
        return
    from onboard.spec import load_spec

    sizes = ("hidden_size", "num_hidden_layers", "vocab_size")
    config = tuple(run.config.get(key) for key in sizes)
    if config == tuple(getattr(run.spec, key) for key in sizes):
        return
    parent = run.root.parent
    candidates = [run.root / "spec.yaml"]
    if parent.name == "checkpoints":  # new-model's DIR/checkpoints/<name>
        candidates.append(parent.parent / "spec.yaml")
    for path in candidates:
        if not path.is_file():
            continue
        try:
            own = load_spec(path)
        except InputError:  # a hint only: a spec that does not load is skipped
            continue
        if tuple(getattr(own, key) for key in sizes) == config:
            command = shlex.join(
                [
                    "onboard",
                    "spec",
                    "check",
                    str(path),
                    "--checkpoint",
                    str(run.root),
                ]
            )
            run.add(
                "note",
                "spec-hint",
                str(path),
                "has this checkpoint's sizes (the spec checked has not); check "
                f"against it: {command}",
            )
            return
