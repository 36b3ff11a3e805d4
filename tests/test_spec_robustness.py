"""What a hostile or careless spec can make onboard do: refused with a located,
one-line message, quickly and in bounded memory, never a traceback or a hang.

Each case is one the issue tracker saw misbehave (tracebacks, hangs, memory
blow-ups, generated code that called itself); tests/test_spec_fuzz.py drives the
same stages with random specs.
"""

from __future__ import annotations

import ast
import json
import os
import re
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml

from onboard.errors import InputError
from onboard.spec import SpecError, load_spec, parse_spec_text
from onboard.spec.bases import FAMILY_CLASSES
from onboard.spec.hf import spec_from_hf_config, spec_from_hf_config_file
from onboard.spec.loader import MAX_PROBLEMS
from onboard.spec.module_tree import NN_MODULE_ATTRIBUTES
from onboard.spec.rules import GENERATED_NAMES, generated_class_names

ROOT = Path(__file__).resolve().parents[1]
ONBOARD = ROOT / ".venv" / "bin" / "onboard"
LOCATED = re.compile(r"^[^\n]+?:\d+:\d+: \S+: .+$")
BASE = (ROOT / "model_specs" / "dense-gqa.yaml").read_text()
NO_CHECKPOINT = BASE.replace("checkpoint: {layout: llama}\n", "")


@contextmanager
def within(seconds: int):
    """Fail (instead of hanging the suite) when the block runs past ``seconds``."""

    def expired(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def refused(text: str) -> list[str]:
    """The problem lines of a spec that must be refused (each located, printable)."""
    with within(5), pytest.raises(SpecError) as info:
        parse_spec_text(text, "hostile.yaml")
    lines = str(info.value).split("\n")
    for line in lines:
        assert line.isprintable(), line
        assert LOCATED.match(line) or line.startswith("... and "), line
    return lines


def with_names(body: str) -> str:
    return NO_CHECKPOINT + "checkpoint:\n  tensor_names:\n" + body


# ---- the YAML itself ------------------------------------------------------------


def _alias_bomb(levels: int) -> str:
    lines = ["l0: &l0 [x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    "text, says",
    [
        ("a: " + "[" * 1000 + "]" * 1000 + "\n", "nested deeper than"),
        ("a: " + "{b: " * 500 + "1" + "}" * 500 + "\n", "nested deeper than"),
        ("a: &x [*x]\n", "recursive structure"),
        ("a: &x {b: *x}\n", "recursive structure"),
        (_alias_bomb(6), "YAML nodes"),  # ~1 KB, 9^6 nodes once expanded
        (_alias_bomb(7), "YAML nodes"),
        ("".join(f"k{i}: 1\n" for i in range(50_000)), "YAML nodes"),
        (NO_CHECKPOINT.replace("vocab_size: 128256", "vocab_size: !!int abc"), "int"),
        (NO_CHECKPOINT.replace("128256", "9" * 5000), "digits"),
        (NO_CHECKPOINT.replace("hidden_size: 4096", "hidden_size: !!float x"), "float"),
        ("a: !!binary 'not base64 ***'\n", "base64"),
        ("a: !!timestamp 2026-13-45\n", "timestamp"),
        ("a: !!python/object:os.system x\n", "invalid YAML"),
    ],
    ids=[
        "deep-lists", "deep-maps", "self-alias", "self-alias-map", "alias-bomb",
        "alias-bomb-deeper", "50k-keys", "int-tag-on-text", "5000-digit-int",
        "float-tag-on-text", "bad-binary", "bad-timestamp", "python-tag",
    ],
)  # fmt: skip
def test_hostile_yaml_is_refused_quickly_at_a_location(text, says):
    lines = refused(text)
    assert says in " ".join(lines)


def test_a_spec_file_that_is_not_a_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "spec.yaml"
    os.mkfifo(fifo)  # reading it would block forever
    for path in (fifo, Path("/dev/zero"), tmp_path):
        with within(5), pytest.raises(SpecError, match="not a regular file"):
            load_spec(path)


def test_unknown_key_holding_brackets_is_named():
    (line,) = refused(NO_CHECKPOINT + "foo[0]: 1\n")
    assert "foo[0]: unknown field 'foo[0]'" in line


def test_the_problem_list_is_capped_with_a_count():
    text = NO_CHECKPOINT + "".join(f"unknown_{i}: 1\n" for i in range(700))
    lines = refused(text)
    assert len(lines) == MAX_PROBLEMS + 1
    assert lines[-1] == f"... and {700 - MAX_PROBLEMS} more problems"


def test_a_huge_value_is_not_echoed_in_full():
    (line,) = refused(
        NO_CHECKPOINT.replace("vocab_size: 128256", "vocab_size: " + "x" * 100_000)
    )
    assert len(line) < 400 and "more characters" in line


@pytest.mark.parametrize("key", ["a key with spaces", "k" * 300])
def test_a_key_stays_one_token_of_the_located_line(key):
    # refused() asserts the FILE:LINE:COL: PATH: message shape, PATH one token.
    (line,) = refused(NO_CHECKPOINT + f"{key}: 1\n")
    path = line.split(": ")[1]
    assert " " not in path and len(path) < 100


def test_terminal_escapes_and_newlines_in_keys_are_printed_escaped(tmp_path):
    key = '"\\e]0;PWNED\\a\\e[2J\\nline2\\u202e"'
    spec = tmp_path / "escapes.yaml"
    spec.write_text(NO_CHECKPOINT + f"{key}: 1\n")
    (line,) = refused(spec.read_text())
    assert "\\x1b]0;PWNED\\x07" in line and "\\n" in line and "\\u202e" in line
    # The CLI prints it the same way: one line, no raw escape reaches the terminal.
    run = subprocess.run(
        [str(ONBOARD), "spec", "check", str(spec)], capture_output=True, text=True
    )
    assert run.returncode == 2
    assert "\x1b" not in run.stderr and "\u202e" not in run.stderr
    assert run.stderr.count("\n") == 1 and "PWNED" in run.stderr


# ---- numbers --------------------------------------------------------------------


@pytest.mark.parametrize(
    "old, new, path",
    [
        ("head_dim: 128", "head_dim: 1.0e+400", "attention.head_dim"),
        ("head_dim: 128", "head_dim: 1e400", "attention.head_dim"),
        ("head_dim: 128", "head_dim: 1000000", "attention.head_dim"),
        ("theta: 500000.0", "theta: .inf", "rope.theta"),
        ("eps: 1.0e-05", "eps: .nan", "norm.eps"),
        ("factor: 8.0", "factor: .nan", "rope.scaling.factor"),
        ("num_hidden_layers: 32", "num_hidden_layers: 100000000", "num_hidden_layers"),
        ("num_hidden_layers: 32", f"num_hidden_layers: {2**63}", "num_hidden_layers"),
        ("vocab_size: 128256", f"vocab_size: {2**31}", "vocab_size"),
        ("num_heads: 32", "num_heads: 100000", "attention.num_heads"),
        ("hidden_size: 4096", "hidden_size: 1048576", "hidden_size"),
    ],
)
def test_numbers_beyond_what_vllm_represents_are_refused(old, new, path):
    assert old in NO_CHECKPOINT
    lines = refused(NO_CHECKPOINT.replace(old, new))
    assert any(f": {path}: " in line for line in lines), lines


def test_non_finite_router_values_never_reach_generated_code():
    spec = (ROOT / "model_specs" / "deepseek-v3-style.yaml").read_text()
    assert "routed_scaling_factor: 2.5" in spec
    for value in (".inf", ".nan", "-.inf"):
        lines = refused(spec.replace("2.5", value, 1))
        assert any("routed_scaling_factor" in line for line in lines)


# ---- tensor names and generated names -----------------------------------------


@pytest.mark.parametrize(
    "template, says",
    [
        ("model.layers.{layer:0>400000000}.self_attn.q_proj", "not a dotted"),
        ("model.layers.{layer:9999}.self_attn.q_proj", "not a dotted"),
        ("model.layers.{layer!z}.self_attn.q_proj", "not a dotted"),
        ("model.layers.{layer.real}.self_attn.q_proj", "not a dotted"),
        ("model.layers.{0}.self_attn.q_proj", "not a dotted"),
        ("model.layers.{}.self_attn.q_proj", "not a dotted"),
        ("model.layers.{layer.self_attn.q_proj", "not a dotted"),
        ("model.layers.self_attn.q_proj", "exactly {layer}"),
        ("model.layers.{layer}.self_attn.class", "Python keyword"),
        ("model.layers.{layer}.self_attn._modules", "private"),
        ("model.layers.{layer}.self_attn.training", "torch.nn.Module"),
        ("model.layers.{layer}.self_attn.forward", "torch.nn.Module"),
        ("model.layers.{layer}..q_proj", "not a dotted"),
        ("model.layers.{layer}.self_attn.k_proj", "also the path of k_proj"),
        ("a" * 300 + ".{layer}", "longer than"),
    ],
)
def test_tensor_name_templates_are_plain_paths(template, says):
    lines = refused(with_names(f"    q_proj: '{template}'\n"))
    assert any(
        "checkpoint.tensor_names.q_proj" in line and says in line for line in lines
    ), lines


def test_a_role_named_after_a_module_attribute_is_refused():
    (line,) = refused(with_names("    lm_head: training\n"))
    assert "checkpoint.tensor_names.lm_head" in line and "training" in line


@pytest.mark.parametrize(
    "architecture",
    ["VllmConfig", "Iterable", "WeightsMapper", "SupportsPP", "SupportsEagle3",
     "Attention", "RMSNorm", "SiluAndMul", "ParallelLMHead", "PreTrainedModel"],
)  # fmt: skip
def test_architecture_may_not_be_a_name_the_generated_files_import(architecture):
    text = NO_CHECKPOINT.replace(
        "architecture: LlamaForCausalLM", f"architecture: {architecture}"
    )
    lines = refused(text)
    assert any(f"architecture: {architecture!r} is reserved" in x for x in lines)


@pytest.mark.parametrize(
    "architecture, clash",
    [("VllmForCausalLM", "VllmConfig"), ("RouterModel", "RouterModel"),
     ("FooModel", "FooModel")],
)  # fmt: skip
def test_architecture_may_not_collide_with_the_classes_named_after_it(
    architecture, clash
):
    text = NO_CHECKPOINT.replace(
        "architecture: LlamaForCausalLM", f"architecture: {architecture}"
    )
    assert any(clash in line for line in refused(text))


def test_generated_names_list_is_complete():
    """Every capitalised module-level name of every generated file (all template
    branches) is reserved or named after the architecture: a new import in a
    template must be added to GENERATED_NAMES, or `architecture: ThatName`
    would pass spec check and break the generated file."""
    sys.path.insert(0, str(ROOT / "tests"))
    from generate_variants import ALL, any_spec

    from onboard.generate import generate_files

    unlisted: dict[str, str] = {}
    for name in ALL:
        spec = any_spec(name)
        allowed = GENERATED_NAMES | generated_class_names(spec.architecture)
        allowed |= {spec.architecture} | FAMILY_CLASSES
        for path, text in generate_files(spec).items():
            if not path.endswith(".py"):
                continue
            for node in ast.parse(text).body:
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    found = [(a.asname or a.name).split(".")[0] for a in node.names]
                elif isinstance(node, (ast.ClassDef, ast.FunctionDef)):
                    found = [node.name]
                elif isinstance(node, ast.Assign):
                    found = [t.id for t in node.targets if isinstance(t, ast.Name)]
                else:
                    continue
                for found_name in found:
                    if found_name[0].isupper() and found_name not in allowed:
                        unlisted[found_name] = f"{name}: {path}"
    assert not unlisted, f"add to onboard/spec/rules.py GENERATED_NAMES: {unlisted}"


def test_nn_module_attributes_match_torch():
    from torch import nn

    public = {n for n in dir(nn.Module) if not n.startswith("_")}
    public |= {n for n in vars(nn.Module()) if not n.startswith("_")}
    assert public <= NN_MODULE_ATTRIBUTES, sorted(public - NN_MODULE_ATTRIBUTES)


def test_keep_unquantized_regexes_compile_at_check_time():
    (line,) = refused(NO_CHECKPOINT + "keep_unquantized: ['re:(']\n")
    assert "keep_unquantized[0]: bad regular expression" in line
    (line,) = refused(NO_CHECKPOINT + "keep_unquantized: [o_prj]\n")
    assert "did you mean 'o_proj'" in line


# ---- configs and drafts -----------------------------------------------------------


def test_spec_check_on_a_config_json_suggests_from_hf(tmp_path):
    config = tmp_path / "config.json"
    config.write_text(
        json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})
    )
    with pytest.raises(SpecError) as info:
        load_spec(config)
    first = str(info.value).split("\n")[0]
    assert "onboard spec from-hf" in first and first.startswith(f"{config}:1:1:")


def test_a_nan_in_a_config_is_refused_not_called_a_contradiction(tmp_path):
    config = {"model_type": "llama", "architectures": ["LlamaForCausalLM"],
              "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "intermediate_size": 128,
              "max_position_embeddings": 128, "rms_norm_eps": float("nan")}  # fmt: skip
    with pytest.raises(InputError) as info:
        spec_from_hf_config(config)
    assert "rms_norm_eps" in str(info.value) and "NaN or infinite" in str(info.value)
    assert "computes nan" not in str(info.value)
    with pytest.raises(InputError, match="not a regular file"):
        spec_from_hf_config_file(Path("/dev/zero"))


def test_a_draft_model_path_that_is_not_a_regular_file_is_refused(tmp_path):
    from onboard.speculators.write import check_speculators

    data = yaml.safe_load(NO_CHECKPOINT)
    data["speculators"] = [{"method": "draft_model", "model": "/dev/zero"}]
    spec = parse_spec_text(yaml.safe_dump(data))
    # A hang guard, not a timing: the check imports vLLM's config classes first,
    # which alone takes seconds on a loaded 2-core machine.
    with within(120), pytest.raises(InputError, match="not a regular file"):
        check_speculators(spec)


# ---- later stages on what check accepts ------------------------------------------


def test_tiny_refuses_a_checkpoint_beyond_its_size_cap(tmp_path):
    from onboard.checkpoint.tiny import write_tiny_checkpoint

    # Accepted by check; kept dims (head_dim 1024, a long MLA latent would do the
    # same) make the seconds-sized copy too big.
    text = NO_CHECKPOINT.replace("model_type: llama", "model_type: onb_big")
    text = text.replace("LlamaForCausalLM", "OnbBigForCausalLM")
    text = text.replace("head_dim: 128", "head_dim: 1024").replace(
        "num_hidden_layers: 32",
        "num_hidden_layers: 1024\n  # every layer kind repeats only every 1000",
    )
    text = text.replace("  head_dim: 1024", "  head_dim: 1024\n  sliding_window: 64\n"
                        "  sliding_window_pattern: 1000")  # fmt: skip
    spec = parse_spec_text(text)
    with within(20), pytest.raises(InputError, match="parameters"):
        write_tiny_checkpoint(spec, tmp_path / "tiny")
    assert not (tmp_path / "tiny").exists()


def test_layer_selection_is_quick_on_the_largest_layer_count():
    from onboard.spec.shrink import select_layers

    text = NO_CHECKPOINT.replace("num_hidden_layers: 32", "num_hidden_layers: 1024")
    text = text.replace("  head_dim: 128", "  head_dim: 128\n  sliding_window: 64\n"
                        "  sliding_window_pattern: 7")  # fmt: skip
    spec = parse_spec_text(text)
    with within(5):
        keep = select_layers(spec)
    assert keep == list(range(7))  # six sliding layers, then the full one


# ---- the newer features (linear attention, the indexer, sinks, MLA KV sharing,
# norm placement, tensor names of their roles): the spec fuzz's findings ---------


def bundled(name: str, **changes) -> dict:
    """A bundled spec as data, under a model type transformers does not know (so
    generate writes the reference too)."""
    data = yaml.safe_load((ROOT / "model_specs" / f"{name}.yaml").read_text())
    data["model_type"] = "onb_" + data["model_type"]
    data["architecture"] = "Onb" + data["architecture"]
    data.update(changes)
    return data


def text_of(data: dict) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def without_mtp(data: dict) -> dict:
    data.pop("mtp", None)
    data["speculators"] = [s for s in data["speculators"] if s["method"] != "mtp"]
    return data


def glm(**indexer) -> dict:
    data = without_mtp(bundled("glm-5-style"))
    data["attention"]["indexer"].update(indexer)
    return data


def plain_mla_sharing() -> dict:
    """DeepSeek-V3-style with one MLA KV-sharing pair, as generated (no rope
    scaling, no MTP)."""
    data = without_mtp(bundled("deepseek-v3-style"))
    data["rope"].pop("scaling")
    data["max_position_embeddings"] = 4096
    data["attention"]["kv_sharing"] = {5: 4}
    return data


def at(lines: list[str], path: str, says: str = "") -> bool:
    return any(f": {path}: " in line and says in line for line in lines)


def test_short_layer_types_beside_linear_attention_and_names_is_located():
    # used_roles() read layer_types past its end (IndexError) before the length
    # rule could report.
    data = bundled("qwen3-next-style")
    data["attention"]["layer_types"] = ["full_attention", "full_attention"]
    data["checkpoint"]["tensor_names"] = {"o_proj": "model.layers.{layer}.attn.out"}
    lines = refused(text_of(data))
    assert at(lines, "attention.layer_types", "has 2 entries"), lines


def test_shrink_never_starts_on_a_shared_indexer_layer():
    # GLM-5-style, MoE every third layer from layer 0, layer 3 reusing layer 2's
    # top-k: the shortest aligned run started at layer 3, which became tiny layer
    # 0, a shared layer with no earlier indexer (AssertionError in generate's
    # and tiny's shrink).
    from onboard.spec.shrink import shrink_spec

    data = glm(shared_layers=[3])
    data["mlp"]["moe"].update(first_k_dense=0, layer_frequency=3)
    tiny = shrink_spec(parse_spec_text(text_of(data)))
    assert tiny.attention.indexer.shared_layers
    assert 0 not in tiny.attention.indexer.shared_layers


@pytest.mark.parametrize("where", ["kv_sharing", "shared_layers"])
def test_tiny_keeps_the_sharing_layers_of_the_dense_head(where):
    # A sharing layer (or a shared-indexer layer) among the first_k_dense layers
    # had no aligned selection: every layer was kept and tiny refused the spec
    # ("would have N M parameters").
    from onboard.spec.shrink import select_layers, shrink_spec

    if where == "kv_sharing":
        data = plain_mla_sharing()
        data["attention"]["kv_sharing"] = {1: 0}
    else:
        data = glm(shared_layers=[1, 2, 4])
    spec = parse_spec_text(text_of(data))
    with within(5):
        keep = select_layers(spec)
    assert len(keep) <= 4, keep
    tiny = shrink_spec(spec)
    assert tiny.attention.kv_sharing or tiny.attention.indexer.shared_layers


@pytest.mark.parametrize("name", ["A_log", "dt_bias"])
def test_a_linear_attention_mixer_parameter_is_no_module_name(name):
    # A module named A_log beside the mixer's A_log parameter: the reference set
    # a Conv1d and then a Parameter on one attribute, and the vLLM rename regex
    # took the real A_log's tensors too.
    data = bundled("qwen3-next-style")
    data["checkpoint"]["tensor_names"] = {
        "linear_conv1d": f"model.layers.{{layer}}.linear_attn.{name}"
    }
    lines = refused(text_of(data))
    assert at(lines, "checkpoint.tensor_names.linear_conv1d", repr(name)), lines


@pytest.mark.parametrize(
    "spec, role, path, says",
    [
        ("glm-5-style", "indexer_wk", "model.layers.{layer}.self_attn.wk", "shaped"),
        ("glm-5-style", "indexer_wq_b", "model.layers.{layer}.indexer.wq_b", "shaped"),
        ("glm-5-style", "indexer_k_norm", "model.layers.{layer}.self_attn.idx.k_norm",
         "one module per block"),
        ("qwen3-next-style", "linear_conv1d", "model.layers.{layer}.conv1d", "shaped"),
        ("qwen3-next-style", "linear_out_proj", "model.layers.{layer}.mixer.out_proj",
         "one module per block"),
        ("gpt-oss-style", "sinks", "model.layers.{layer}", "parameter of the module"),
    ],
)  # fmt: skip
def test_a_path_outside_the_reference_module_tree_is_refused_at_check(
    spec, role, path, says
):
    # generate dropped the reference for these (hf/README.md alone); a sink on
    # the decoder layer wrote a tiny checkpoint transformers' GptOss does not load.
    data = bundled(spec)
    data["checkpoint"]["tensor_names"] = {role: path}
    lines = refused(text_of(data))
    assert at(lines, f"checkpoint.tensor_names.{role}", says), lines


def test_an_override_of_a_role_the_model_lacks_is_refused():
    data = yaml.safe_load(NO_CHECKPOINT)
    data["checkpoint"] = {
        "tensor_names": {"indexer_wk": "model.layers.{layer}.self_attn.indexer.wk"}
    }
    lines = refused(text_of(data))
    assert at(lines, "checkpoint.tensor_names.indexer_wk", "has no indexer_wk"), lines


def test_the_indexer_top_k_is_bounded():
    # The generated model allocates max_num_batched_tokens x index_topk int32.
    from onboard.components.indexer import MAX_INDEX_TOPK

    lines = refused(text_of(glm(topk=2**31 - 1)))
    assert at(lines, "attention.indexer.topk", str(MAX_INDEX_TOPK)), lines
    parse_spec_text(text_of(glm(topk=MAX_INDEX_TOPK)))


def test_an_index_head_dim_off_the_fp8_groups_is_refused_beside_a_gpu_target():
    from onboard.targets.check import target_findings

    def findings(data):
        found = target_findings(parse_spec_text(text_of(data)))
        return [f for f in found if f.path == ("attention", "indexer", "head_dim")]

    assert not findings(glm())
    (finding,) = findings(glm(head_dim=96))
    assert finding.level == "error" and "b200" in finding.message
    data = glm(head_dim=96)
    data["targets"] = ["cpu"]  # the cpu engine runs sparse MLA densely
    (finding,) = findings(data)
    assert finding.level == "warning"


@pytest.mark.parametrize(
    "change, path",
    [
        (lambda d: d["attention"]["indexer"].update(topk=True),
         "attention.indexer.topk"),
        (lambda d: d["attention"]["indexer"].update(rope_interleave=1),
         "attention.indexer.rope_interleave"),
        (lambda d: d["attention"].update(kv_sharing={True: 0}), "attention.kv_sharing"),
        (lambda d: d["norm"].update(eps=True), "norm.eps"),
        (lambda d: d.update(vocab_size="512"), "vocab_size"),
    ],
)  # fmt: skip
def test_booleans_are_not_numbers(change, path):
    data = glm()
    change(data)
    lines = refused(text_of(data))
    assert any(f": {path}" in line for line in lines), lines


def test_a_union_field_is_refused_once():
    data = yaml.safe_load(NO_CHECKPOINT)
    data["attention"]["query_pre_attn_scalar"] = True
    (line,) = refused(text_of(data))
    assert ": attention.query_pre_attn_scalar: " in line, line
    assert "constrained" not in line


@pytest.mark.parametrize("architecture", ["ValueError", "RuntimeError", "Exception"])
def test_architecture_may_not_shadow_a_python_builtin(architecture):
    text = NO_CHECKPOINT.replace(
        "architecture: LlamaForCausalLM", f"architecture: {architecture}"
    )
    assert at(refused(text), "architecture", "builtin")


# ---- what check accepted and a later stage refused, unlocated --------------------


@pytest.mark.parametrize(
    "change, path",
    [
        (lambda d: d.update(mtp={"num_heads": 1, "mlp": "moe"}), "mtp"),
        (lambda d: d["rope"].update(scaling={"type": "yarn", "factor": 4.0}),
         "rope.scaling"),
        (lambda d: d["norm"].update(placement="post"), "norm.placement"),
        (lambda d: d["attention"].update(
            llama_4_scaling={"beta": 0.1, "original_max_position_embeddings": 8192}),
         "attention.llama_4_scaling"),
        (lambda d: d.update(residual_multiplier=0.5), "residual_multiplier"),
    ],
    ids=["mtp", "rope-scaling", "post-norm", "llama-4-scaling", "residual-multiplier"],
)  # fmt: skip
def test_mla_kv_sharing_limits_are_rules(change, path):
    data = plain_mla_sharing()
    parse_spec_text(text_of(data))  # the plain form is accepted (and generated)
    change(data)
    lines = refused(text_of(data))
    assert at(lines, path, "latent cache"), lines


@pytest.mark.parametrize(
    "change, path",
    [
        (lambda d: d["linear_attention"].update(state_dtype="bfloat16"),
         "linear_attention.state_dtype"),
        (lambda d: d["norm"].update(eps=1e-6), "norm.eps"),
    ],
)  # fmt: skip
def test_kimi_delta_limits_are_rules(change, path):
    data = bundled("kimi-k3-style")
    change(data)
    assert at(refused(text_of(data)), path, "Kimi delta"), path


@pytest.mark.parametrize("shared", [[5, 4], [4, 4], [0], [78]])
def test_shared_indexer_layers_are_listed_once_in_order(shared):
    lines = refused(text_of(glm(shared_layers=shared)))
    assert at(lines, "attention.indexer.shared_layers"), lines


@pytest.mark.parametrize(
    "spec",
    ["mla_kv_sharing", "mla_kv_sharing_in_head", "glm_shared", "glm_shared_in_head"],
)
def test_accepted_sharing_specs_generate_and_shrink(spec, tmp_path):
    """What the rules now accept of these features, generate writes (with the
    reference) and tiny writes within its size cap."""
    from onboard.checkpoint.tiny import write_tiny_checkpoint
    from onboard.generate import generate_files

    data = {
        "mla_kv_sharing": plain_mla_sharing,
        "mla_kv_sharing_in_head": lambda: {
            **plain_mla_sharing(),
            "attention": {**plain_mla_sharing()["attention"], "kv_sharing": {1: 0}},
        },
        "glm_shared": lambda: glm(shared_layers=[4, 9]),
        "glm_shared_in_head": lambda: glm(shared_layers=[1, 2, 4]),
    }[spec]()
    parsed = parse_spec_text(text_of(data))
    files = generate_files(parsed)
    assert any(name.startswith("hf/modeling_") for name in files), sorted(files)
    with within(60):
        write_tiny_checkpoint(parsed, tmp_path / "tiny")


@pytest.mark.parametrize("key", ["0x21", "041", "3_3", "true"])
def test_a_key_written_in_another_integer_form_is_located_at_the_key(key):
    # kv_sharing {0x21: 0}: YAML reads 33; the location fell back to the mapping.
    data = yaml.safe_load(NO_CHECKPOINT)
    data["attention"]["kv_sharing"] = {}
    # After a good pair, so the mapping's own location is another line.
    text = text_of(data).replace(
        "kv_sharing: {}", f"kv_sharing:\n    2: 1\n    {key}: 0"
    )
    (line,) = refused(text)
    row = next(
        i for i, x in enumerate(text.splitlines(), 1) if x.strip().startswith(key)
    )
    assert f":{row}:5: attention.kv_sharing[" in line, line


def test_a_merge_key_then_an_override_is_no_duplicate():
    data = yaml.safe_load(NO_CHECKPOINT)
    heads = data["attention"].pop("num_kv_heads")
    text = text_of(data).replace(
        "attention:\n",
        f"attention:\n  <<: {{num_kv_heads: {heads * 2}, qkv_bias: false}}\n"
        f"  num_kv_heads: {heads}\n",
    )
    assert parse_spec_text(text).attention.num_kv_heads == heads
    twice = text.replace(
        f"  num_kv_heads: {heads}\n", f"  num_kv_heads: {heads}\n  num_kv_heads: 1\n"
    )
    assert any("duplicate key" in line for line in refused(twice))
