"""DSpark, DFlash2 (and adaptive verification) on vLLM 0.32's CPU build: vLLM
runs them in the V2 model runner only, which needs Triton; the CPU build's
Triton has no CPU backend. The spec-decode check says so (not-run, with vLLM's
file and line) instead of looking for a draft, and the emitted GPU script notes
that it is where they are measured. vLLM's own config validation is asked, no
engine started."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from onboard.checkpoint.tiny import write_tiny_checkpoint
from onboard.spec import load_spec
from onboard.speculators.heads import head_config
from onboard.targets.cpu_kernels import cpu_method_limit

ROOT = Path(__file__).resolve().parents[1]


def _vllm_file(relative: str) -> list[str]:
    import vllm

    return (Path(vllm.__file__).parent / relative).read_text().splitlines()


def test_the_cited_lines_say_what_the_reason_says():
    # The reason names file:line of the pinned vLLM; keep them honest.
    reason = cpu_method_limit("dspark")
    assert "vllm/config/vllm.py:2976-2981" in reason and "724-728" in reason
    lines = _vllm_file("config/vllm.py")
    assert "dspark speculative decoding" in "\n".join(lines[2975:2981])
    assert "adaptive draft verification" in "\n".join(lines[2975:2981])
    assert "Model Runner V2 requires Triton" in "\n".join(lines[723:728])
    assert "Model Runner V2 requires Triton" in lines[3189]
    assert "Model Runner V1 does not support" in "\n".join(lines[3197:3202])
    reason = cpu_method_limit("dflash2")
    assert "vllm/config/vllm.py:2987-2991" in reason and "724-728" in reason
    assert "DFlash candidate-head drafts" in "\n".join(lines[2986:2991])
    assert "qwen3_dflash2.py:25" in reason and "__init__.py:34-39" in reason
    assert _vllm_file("model_executor/models/qwen3_dflash2.py")[24] == "@triton.jit"
    init = "\n".join(_vllm_file("v1/worker/gpu/spec_decode/__init__.py")[33:39])
    assert "DFlash2Speculator" in init
    for runs in ("dflash", "eagle3", "p_eagle"):
        assert cpu_method_limit(runs) is None


@pytest.mark.parametrize(
    ("method", "adaptive", "refused"),
    [
        ("dspark", False, "dspark speculative decoding"),
        ("dspark", True, "dspark speculative decoding"),
        ("dflash2", True, "DFlash candidate-head drafts"),
    ],
)
def test_vllm_refuses_on_the_cpu_build(tmp_path, method, adaptive, refused):
    from vllm.engine.arg_utils import EngineArgs

    from onboard.spec.model import Speculator
    from onboard.speculators.methods import speculative_config

    spec = load_spec(ROOT / "model_specs" / "dense-gqa.yaml")
    tiny_dir = write_tiny_checkpoint(spec, tmp_path / "tiny", seed=0)
    tiny = load_spec(tiny_dir / "spec.yaml")
    draft = tmp_path / method
    draft.mkdir()
    config = head_config(tiny, method, 3, draft_vocab=tiny.vocab_size)
    (draft / "config.json").write_text(json.dumps(config))
    # onboard's own config (dflash2: vLLM's dflash, with adaptive verification).
    speculative = speculative_config(Speculator(method=method), str(draft))
    speculative["enable_adaptive_verification"] = adaptive
    args = EngineArgs(
        model=str(tiny_dir),
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=256,
        enforce_eager=True,
        speculative_config=speculative,
    )
    with pytest.raises(Exception, match="Model Runner V1 does not support") as err:
        args.create_engine_config()
    assert refused in str(err.value)
    assert ("adaptive draft verification" in str(err.value)) == adaptive


@pytest.mark.parametrize("method", ["dspark", "dflash2"])
def test_check_is_not_run_with_the_reason(method):
    from onboard.validate.check_spec_decode import run

    spec = load_spec(ROOT / "model_specs" / "dense-gqa.yaml")
    ctx = types.SimpleNamespace(engine=object(), spec=spec)
    check = run(ctx, f"spec-decode:{method}")
    assert check.status == "not-run"
    assert "V2 model runner" in check.details and "vllm/config/vllm.py" in check.details


def test_emitted_script_notes_dspark():
    from onboard.validate.emit import _speculative_variants

    spec = load_spec(ROOT / "model_specs" / "dense-gqa.yaml")
    spec = spec.model_copy(
        update={
            "speculators": [
                spec.speculators[0].model_copy(
                    update={"method": "dspark", "model": "org/dspark-head"}
                )
            ]
        }
    )
    notes: list[str] = []
    variants = _speculative_variants(spec, notes)
    assert "spec-dspark" in variants  # the GPU script serves it
    assert any("dspark" in n and "not-run" in n for n in notes), notes


def test_adaptive_verification_reasons_cite_what_vllm_says():
    # The tuner predicts adaptive verification and says why it measures none;
    # the methods' configs set it where vLLM implements it. Keep the citations
    # honest against the pinned vLLM.
    from onboard.speculators.methods import ADAPTIVE_METHODS
    from onboard.speculators.tune import ADAPTIVE_NOT_MEASURED

    for cited in ("vllm.py:2980-2981", "724-728", "vllm.py:3013-3018"):
        assert cited in ADAPTIVE_NOT_MEASURED
    lines = _vllm_file("config/vllm.py")
    assert "adaptive draft verification" in "\n".join(lines[2979:2981])
    assert "requires full CUDA graphs" in "\n".join(lines[3012:3018])
    field = "\n".join(_vllm_file("config/speculative.py")[550:553])
    assert "enable_adaptive_verification" in field and "dspark" in field
    runner = "\n".join(_vllm_file("v1/worker/gpu/spec_decode/speculator.py")[169:176])
    assert "self.use_acceptance_estimator = self.enable_adaptive_verification" in runner
    rule = _vllm_file("v1/worker/gpu/spec_decode/adaptive_verification.py")
    assert "def get_num_tokens" in rule[281]
    assert "np.argmax(num_tokens_to_estimated_accepted_tokens / costs)" in rule[343]
    assert set(ADAPTIVE_METHODS) == {"dspark", "dflash2"}
