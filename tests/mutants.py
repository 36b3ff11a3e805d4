"""Mutation testing of validation: subtle faults injected into a generated model,
each of which `onboard validate` must fail.

A *mutant* is the generated plugin of a bundled spec's tiny checkpoint with one
fault written into its model file: a code edit (the rope's pair layout, the
softmax scale, a norm's eps, the router's correction bias, a KV-sharing target)
or a change to the checkpoint tensors as the model's ``load_weights`` receives
them (gate and up projections swapped, linear attention's decay rates negated).
Each fault is a mistake a hand-written port makes and that still loads and
generates text: nothing crashes, only the numbers are wrong. A fault whose
pattern is not in the spec's generated file does not apply to that spec.

    .venv/bin/python tests/mutants.py SPEC.yaml [SPEC.yaml ...] [--faults A,B]
        [--work DIR] [--json OUT.json]

runs, per spec: the tiny checkpoint, the generated model, `validate --checks
accuracy` on it unmutated (which must pass), then once per applicable fault
(one engine start each), and prints the table of docs/validation.md ("Mutation
testing"): the fault, the verdict, and the figures the accuracy check failed on.
The mutation score is faults caught / faults injected. tests/test_mutation.py
runs a sample in `make test` and every fault on every bundled spec in
`make test-all`.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Fault:
    name: str
    what: str  # the mistake, as the docs' table states it
    # The model file's text -> the mutated text, or None where the fault does
    # not apply to this model (its pattern is absent).
    inject: Callable[[str], str | None]


def _sub_first(pattern: str, repl: Callable[[re.Match], str] | str):
    """A fault that rewrites the first match of ``pattern``."""

    def inject(text: str) -> str | None:
        new, n = re.subn(pattern, repl, text, count=1, flags=re.M)
        return new if n else None

    return inject


def _sub_all(pattern: str, repl: str):
    """A fault that rewrites every match of ``pattern``."""

    def inject(text: str) -> str | None:
        new, n = re.subn(pattern, repl, text, flags=re.M)
        return new if n else None

    return inject


def _on_weights(transform: str, applies: Callable[[str], bool]):
    """A fault in the tensors the model loads: ``transform`` (an expression of
    ``n``, the checkpoint name, and ``w``, the tensor, giving ``(n, w)``) is put
    at the top of the model's entry ``load_weights`` (the file's last one: the
    inner modules' are called with what it hands on, so the fault is made once)."""

    def inject(text: str) -> str | None:
        if not applies(text):
            return None
        defs = list(
            re.finditer(
                r"^([ \t]+)def load_weights\(self, weights[^\n]*:\n", text, re.M
            )
        )
        if not defs:
            return None
        last = defs[-1]
        indent = last.group(1) + "    "
        line = f"{indent}weights = ({transform} for n, w in weights)  # mutant\n"
        return text[: last.end()] + line + text[last.end() :]

    return inject


# Swap two names in a tensor's path (gate_proj <-> up_proj), through a
# placeholder that no checkpoint name contains.
_SWAP_GATE_UP = (
    '(n.replace(".gate_proj.", ".@.").replace(".up_proj.", ".gate_proj.")'
    '.replace(".@.", ".up_proj."), w)'
)

FAULTS: tuple[Fault, ...] = (
    Fault(
        "rope_layout",
        "rotary pairs interleaved instead of halves (or the reverse)",
        _sub_first(
            r"is_neox_style=([^\n]+),$", lambda m: f"is_neox_style=not ({m[1]}),"
        ),
    ),
    Fault(
        "softmax_scale",
        "attention's softmax scale 5% too large",
        _sub_first(r"^(\s+self\.scaling = [^\n]+)$", lambda m: f"{m[1]} * 1.05"),
    ),
    Fault(
        "norm_eps",
        "the decoder layers' input norm eps 100x the config's",
        _sub_all(
            r"(self\.input_layernorm = \w+\(self\.hidden_size, eps=config\.\w+)\)",
            r"\1 * 100)",
        ),
    ),
    Fault(
        "gate_up_swapped",
        "the MLPs' gate and up projections loaded into each other's place",
        _on_weights(_SWAP_GATE_UP, lambda t: '"gate_proj"' in t or ".gate_proj" in t),
    ),
    Fault(
        "router_bias_dropped",
        "the router's score-correction bias left out of expert selection",
        _sub_all(
            r"e_score_correction_bias=self\.gate\.e_score_correction_bias,",
            "e_score_correction_bias=None,",
        ),
    ),
    Fault(
        "kv_sharing_target",
        "a KV-sharing layer reads the layer before its target",
        _sub_first(
            r'(kv_sharing_target_layer_name = f"\{layers_prefix\}\.)\{target\}(\.)',
            r"\1{target - 1 if target > 0 else target + 1}\2",
        ),
    ),
    Fault(
        "sinks_dropped",
        "attention run without its learned sink logits",
        _sub_all(r"^(\s+)sinks=self\.sinks,$", r"\1sinks=None,"),
    ),
    Fault(
        "sliding_window_dropped",
        "sliding-window layers attend over the whole context",
        _sub_all(
            r"^(\s+)sliding_window = config\.sliding_window$",
            r"\1sliding_window = None",
        ),
    ),
    Fault(
        "indexer_head_weights_reversed",
        "the sparse-MLA indexer weighs each head's scores by another head's weight",
        _sub_first(
            r"^(\s+)return q, k, weights \* ",
            r"\1return q, k, weights.flip(-1) * ",
        ),
    ),
    Fault(
        "norm_bridge_dropped",
        "norm weights loaded as stored, where the family vLLM ships scales by "
        "1 + weight (a modular file's bridge left out)",
        _sub_all(r"^(\s+tensor = tensor) [-+] [\d.]+$", r"\1"),
    ),
    Fault(
        "linear_decay_negated",
        "linear attention's log decay rates (A_log) loaded negated",
        _on_weights(
            '(n, -w if n.endswith(".A_log") else w)',
            lambda t: "A_log" in t or "Delta" in t,
        ),
    ),
)


def model_file(generated: Path) -> Path:
    """The plugin's model file (``onboard_plugin_<module>/<module>.py``)."""
    (package,) = (generated / "plugin").glob("onboard_plugin_*")
    return package / f"{package.name.removeprefix('onboard_plugin_')}.py"


def mutate(generated: Path, fault: Fault, out: Path) -> bool:
    """``generated`` with ``fault`` injected, at ``out``; False where the fault
    does not apply."""
    text = model_file(generated).read_text()
    mutated = fault.inject(text)
    if mutated is None or mutated == text:
        return False
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(generated, out)
    model_file(out).write_text(mutated)
    return True


def _figures(result) -> dict:
    check = result.check("accuracy")
    if check is None:
        return {}
    m = check.metrics
    keys = ("prompt_logprob_max_abs_diff", "prompt_top1_agreement",
            "greedy_identical_sequences", "greedy_failed_sequences")  # fmt: skip
    figures = {k: m.get(k) for k in keys if k in m} | {"status": check.status}
    indexer = result.check("indexer")
    if indexer is not None:
        figures["indexer"] = indexer.status
    return figures


def run(
    spec_path: Path,
    work: Path,
    faults: list[str] | None = None,
    standalone: bool = False,
) -> dict:
    """The unmutated model's verdict and each applicable fault's (``standalone``:
    of the whole generated model where a modular file would be generated)."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.generate import generate_files, write_trees
    from onboard.spec import load_spec
    from onboard.validate import validate

    work.mkdir(parents=True, exist_ok=True)
    ckpt = write_tiny_checkpoint(load_spec(spec_path), work / "ckpt", seed=0)
    tiny = ckpt / "spec.yaml"
    generated = work / "generated"
    shutil.rmtree(generated, ignore_errors=True)
    write_trees(generate_files(load_spec(tiny), standalone), generated)

    # Sparse MLA's indexer picks tokens only past its top-k, beyond the accuracy
    # check's prompts: its own check compares it on a longer context.
    checks = "accuracy,indexer" if load_spec(tiny).attention.indexer else "accuracy"

    def verdict(gen: Path, name: str) -> dict:
        result = validate(ckpt, tiny, "cpu", work / "validation" / name,
                          generated=gen, checks=checks)  # fmt: skip
        return {"passed": result.passed, **_figures(result)}

    label = f"{spec_path.stem} (standalone)" if standalone else spec_path.stem
    report = {"spec": label, "unmutated": verdict(generated, "unmutated")}
    report["faults"] = {}
    for fault in FAULTS:
        if faults and fault.name not in faults:
            continue
        out = work / "mutants" / fault.name
        if not mutate(generated, fault, out):
            continue
        report["faults"][fault.name] = {"what": fault.what, **verdict(out, fault.name)}
        shutil.rmtree(out, ignore_errors=True)
    return report


def score(reports: list[dict]) -> tuple[int, int]:
    """(faults caught, faults injected) over the reports."""
    results = [f for r in reports for f in r["faults"].values()]
    return sum(not f["passed"] for f in results), len(results)


def table(reports: list[dict]) -> str:
    lines = [
        "| spec | fault | verdict | largest prompt-logprob diff | prompt top-1 "
        "| greedy identical / failed |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in reports:
        rows = [("unmutated", r["unmutated"])] + list(r["faults"].items())
        for name, f in rows:
            status = {"accuracy": f.get("status"), "indexer": f.get("indexer")}
            failed = [check for check, s in status.items() if s == "failed"]
            verdict = "passed" if f["passed"] else f"**caught** ({', '.join(failed)})"
            if name == "unmutated":
                verdict = "passed" if f["passed"] else "FAILED (unmutated)"
            diff = f.get("prompt_logprob_max_abs_diff")
            top1 = f.get("prompt_top1_agreement")
            lines.append(
                f"| {r['spec']} | {name} | {verdict} | "
                f"{'' if diff is None else f'{diff:.3g}'} | "
                f"{'' if top1 is None else f'{top1:.3f}'} | "
                f"{f.get('greedy_identical_sequences', '')} / "
                f"{f.get('greedy_failed_sequences', '')} |"
            )
    caught, injected = score(reports)
    lines.append(f"\nmutation score: {caught} / {injected}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("specs", nargs="+", type=Path)
    ap.add_argument("--faults", help="comma-separated fault names (default: all)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/onboard-mutants"))
    ap.add_argument("--json", type=Path)
    ap.add_argument(
        "--standalone",
        action="store_true",
        help="the whole generated model where a modular file would be generated",
    )
    args = ap.parse_args()
    faults = args.faults.split(",") if args.faults else None
    reports = []
    for spec in args.specs:
        reports.append(run(spec, args.work / spec.stem, faults, args.standalone))
        if args.json:
            args.json.write_text(json.dumps(reports, indent=1))
        print(table(reports[-1:]), flush=True)
    print("\n" + table(reports))


if __name__ == "__main__":
    main()
