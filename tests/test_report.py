"""report.html and summary.md (onboard.report).

The page's numbers are read back from the HTML (``data-path`` / ``data-value`` of
every number and plot mark) and compared with the validation.json files they came
from; the plan's numbers with ``onboard.serving``. The page is rendered in a real
headless Chromium (Debian's ``/usr/bin/chromium``, driven over the DevTools
protocol): no console errors, nothing fetched, every plot visible; the screenshots
are kept in ``test-artifacts/`` (or ``$ONBOARD_TEST_ARTIFACTS``).

The engine test renders the report of a real `onboard validate` run of a tiny
Llama checkpoint (accuracy and kv-cache checks); the other tests use
``report_samples.full_result``, which fills in every plotted metric.
"""

from __future__ import annotations

import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest
from report_browser import WIDTH, render_page
from report_samples import accuracy_check, full_result
from validate_fixtures import LLAMA_SPEC, write_llama, write_spec

from onboard.report import markdown_summary, render_report, write_report
from onboard.report.data import PLAN_CONCURRENCY, kv_budgets, verdict_lines
from onboard.report.svg import fmt
from onboard.serving import make_deployment
from onboard.serving.weights import weight_report
from onboard.spec import load_spec, parse_spec_text
from onboard.validate.results import Check, ValidationResult

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(os.environ.get("ONBOARD_TEST_ARTIFACTS", ROOT / "test-artifacts"))
ONBOARD = str(Path(sys.executable).with_name("onboard"))
NOVEL = ROOT / "model_specs" / "novel-launch.yaml"


class _Numbers(HTMLParser):
    """Every element with a data-path: (path, data-value, text inside)."""

    def __init__(self):
        super().__init__()
        self.found: list[dict] = []
        self._open: list[dict | None] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.add(tag)
        item = None
        if "data-path" in a:
            item = {"tag": tag, "path": a["data-path"], "value": a["data-value"]}
            item["text"] = ""
            self.found.append(item)
        if tag not in ("meta", "line", "circle", "rect", "br", "polyline"):
            self._open.append(item)
        elif item is not None:
            item["text"] = None  # a plot mark: its number is data-value only

    def handle_endtag(self, tag):
        if tag not in ("meta", "line", "circle", "rect", "br", "polyline"):
            if self._open:
                self._open.pop()

    def handle_data(self, data):
        for item in self._open:
            if item is not None and item["text"] is not None:
                item["text"] += data


def numbers(page: str) -> list[dict]:
    parser = _Numbers()
    parser.feed(page)
    return parser.found


def resolve(files: list[dict], pointer: str):
    node = files
    for token in pointer.split("/")[1:]:
        token = token.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def leaves(node, path=""):
    """(pointer, value) of every number in a JSON tree."""
    if isinstance(node, dict):
        for k, v in node.items():
            yield from leaves(
                v, f"{path}/{str(k).replace('~', '~0').replace('/', '~1')}"
            )
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from leaves(v, f"{path}/{i}")
    elif isinstance(node, int | float) and not isinstance(node, bool):
        yield path, node


def assert_numbers_match(page: str, files: list[dict]) -> int:
    """Every validation.json number in the page equals the file's, as written and
    as data; every metric number of every check is in the page. Returns how
    many numbers were compared."""
    found = numbers(page)
    shown = set()
    for item in found:
        if item["path"].startswith("plan:"):
            continue
        value = resolve(files, item["path"])
        assert float(item["value"]) == float(value), item
        if item["text"] is not None:
            assert item["text"].strip() == fmt(value), item
        shown.add(item["path"])
    for i, data in enumerate(files):
        for j, check in enumerate(data["checks"]):
            for path, _ in leaves(check["metrics"], f"/{i}/checks/{j}/metrics"):
                assert path in shown, f"{path} of {check['name']} is not in the page"
    return len(found)


def write_files(tmp: Path, results: list[ValidationResult]) -> list[Path]:
    dirs = []
    for r in results:
        d = tmp / r.target
        d.mkdir(parents=True)
        r.write(d)
        dirs.append(d)
    return dirs


def screenshot_path(name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    print(f"\nreport screenshots in {ARTIFACTS}")
    return ARTIFACTS / name


def keep(out: Path, name: str) -> None:
    """Keep a real run's validation.json, report.html and summary.md beside the
    screenshots (test-artifacts/NAME/)."""
    dest = ARTIFACTS / name
    dest.mkdir(parents=True, exist_ok=True)
    for f in ("validation.json", "report.html", "summary.md"):
        shutil.copy2(out / f, dest / f)


def assert_renders(html: Path, shot: Path, plots: int, missing: int = 0):
    page = render_page(html, shot)
    assert page.errors == [], page.errors
    # Nothing but the page itself was requested (no network, no CDN).
    assert page.requests == [html.resolve().as_uri()], page.requests
    # Nothing wider than the window (no horizontal scrolling).
    assert page.page["width"] <= WIDTH and not page.wide, page.wide
    assert len(page.plots) == plots, [p["label"] for p in page.plots]
    for p in page.plots:
        assert p["visible"] and p["width"] > 100 and p["height"] > 40, p
        # Inside the page: nothing cut off at the right edge.
        assert 0 <= p["x"] and p["x"] + p["width"] <= page.page["width"], p
        assert p["marks"], f"{p['label']}: no data marks"
        for m in p["marks"]:
            assert m["width"] > 0 and m["height"] > 0, (p["label"], m)
    assert len(page.missing) == missing, [m["text"] for m in page.missing]
    for m in page.missing:
        assert m["text"].startswith("not measured") and m["height"] > 0
    assert shot.stat().st_size > 10_000
    return page


# -- no engine ----------------------------------------------------------------------


def test_every_number_comes_from_validation_json(tmp_path):
    spec = load_spec(NOVEL)
    dirs = write_files(tmp_path, [full_result("cpu"), full_result("b200", 1.7)])
    write_report(dirs, tmp_path, spec)
    page = (tmp_path / "report.html").read_text()
    files = [json.loads((d / "validation.json").read_text()) for d in dirs]
    assert assert_numbers_match(page, files) > 200
    # One page for both targets, each check of each target in it.
    for data in files:
        for check in data["checks"]:
            assert f">{check['name']} on {data['target']} <" in page


def test_plan_numbers_are_the_plans(tmp_path):
    spec = load_spec(NOVEL)
    page = render_report(full_result(), spec)
    gib = 1 << 30
    budgets = {b.target: b for b in kv_budgets(spec)}
    plan_marks = [n for n in numbers(page) if n["path"].startswith("plan:")]
    assert plan_marks
    plans = {}
    for item in plan_marks:
        target, key = item["path"][5:].split("/", 1)
        if target == "weights":
            scheme = key.split("/")[0]
            expected = weight_report(spec, scheme, "bfloat16").total_bytes
            assert int(item["value"]) == expected
            continue
        if target not in plans:
            plans[target] = make_deployment(
                spec, target, "bf16", concurrency=PLAN_CONCURRENCY
            )
        plan = plans[target]
        chosen = plan.chosen
        expected = {
            "weights": chosen.weights,
            "reserve": chosen.reserve,
            "kv_needed": chosen.kv_needed,
            "kv_free": chosen.kv_budget - chosen.kv_needed,
        }[key]
        assert float(item["value"]) == pytest.approx(expected / gib, rel=1e-12)
        assert budgets[target].kv_bytes_per_token == plan.kv.bytes_per_token
    # The full-size spec does not fit the cpu target: said so, not plotted.
    assert "cpu</td><td colspan='5'>no layout fits" in page
    assert "Plan arithmetic from the spec, not measured" in page


def test_missing_checks_say_not_measured():
    spec = parse_spec_text(LLAMA_SPEC)
    result = ValidationResult(target="cpu", model_dir="/m/tiny-llama")
    result.checks = [
        accuracy_check([1e-6, 2e-6]),
        Check.not_run("speed", "the speed check is not implemented in onboard yet"),
    ]
    page = render_report(result, spec)
    assert page.count("class='missing'>not measured") == 4
    assert "not measured: no spec-decode check in this run" in page
    assert "not measured: speed on cpu not-run (the speed check is not" in page
    assert "not measured: no quant check in this run" in page
    # With no results at all the page still renders, every plot "not measured".
    empty = ValidationResult(target="b200", model_dir="/m")
    empty.checks = [Check.not_run("accuracy", "needs a b200")]
    page = render_report(empty, None)
    assert page.count("class='missing'>not measured") == 6
    assert "No spec given" in page


def test_markdown_summary_has_every_check_and_its_numbers():
    spec = load_spec(NOVEL)
    cpu, b200 = full_result("cpu"), full_result("b200", 1.7)
    text = markdown_summary([cpu, b200], spec)
    lines = text.splitlines()
    assert lines[0] == "### vLLM validation: novel-launch"
    assert "Verdict: cpu ❌ **failed** (1 check failed: quant:nvfp4; " in text
    assert ", b200 ❌ **failed** (1 check failed: quant:nvfp4; " in text
    assert "| check | cpu | b200 |" in lines
    rows = {ln.split(" | ")[0][2:]: ln for ln in lines if ln.startswith("| ")}
    for check in cpu.checks:
        assert check.name in rows
    accuracy = cpu.check("accuracy").metrics["prompt_logprob_max_abs_diff"]
    assert f"max \\|Δ logprob\\| {fmt(accuracy)} nats" in rows["accuracy"]
    kl = b200.check("quant:nvfp4").metrics["kl_divergence"]
    assert f"❌ **failed**: KL {fmt(kl)} nats" in rows["quant:nvfp4"]
    assert "⚪ not run (needs 2 devices" in rows["tensor-parallel"]
    # Every table row has one cell per target (no stray pipes).
    for row in rows.values():
        assert len(re.split(r"(?<!\\)\|", row)) == 5, row


def partly_covered_result() -> ValidationResult:
    """A passing cpu run that did not cover everything: two checks not run and
    two quant checks scored on the dequantized reference (no CPU kernel)."""
    result = full_result()
    result.checks = [c for c in result.checks if c.status != "failed"]
    dequantized = {"path": "dequantized-reference", "engine_error": "no kernel"}
    result.checks += [
        Check("quant:nvfp4", "passed", {"kl_divergence": 0.7, **dequantized}),
        Check("quant:mxfp4", "passed", {"kl_divergence": 1.1, **dequantized}),
        Check.not_run(
            "spec-decode:eagle3",
            "not run on cpu: vLLM 0.32.0 cannot run it here (needs amx_bf16)",
        ),
    ]
    return result


PARTLY_COVERED = (
    "passed (2 checks not run on cpu: tensor-parallel, spec-decode:eagle3; "
    "2 quant checks scored on a dequantized reference (no cpu kernel): "
    "quant:nvfp4, quant:mxfp4)"
)


def test_verdict_names_what_was_not_run_or_only_emulated(tmp_path):
    result = partly_covered_result()
    assert result.passed
    write_report(result, tmp_path)
    summary = (tmp_path / "summary.md").read_text()
    assert f"Verdict: cpu ✅ {PARTLY_COVERED}" in summary
    page = (tmp_path / "report.html").read_text()
    note = PARTLY_COVERED.removeprefix("passed ")
    # In the header and in the runs table, beside the badge.
    assert page.count(f"<span class='verdict-note'>{html.escape(note)}</span>") == 2
    # A fully covered run says just that it passed; a failing one names why.
    covered = ValidationResult("cpu", "/m", checks=[accuracy_check([1e-6])])
    assert verdict_lines(covered) == ["validation (cpu): passed"]
    failing = full_result()
    assert verdict_lines(failing) == [
        "validation (cpu): failed (1 check failed: quant:nvfp4; 1 check not run "
        "on cpu: tensor-parallel)"
    ]
    assert "Verdict: cpu ❌ **failed** (1 check failed: quant:nvfp4;" in (
        markdown_summary(failing)
    )
    # No check failed, but the engine could not run the model (accuracy not-run).
    blocked = ValidationResult(
        "cpu",
        "/m",
        checks=[
            Check.not_run("accuracy", "no CPU kernel"),
            Check.not_run("kv-cache", ""),
        ],
    )
    assert verdict_lines(blocked) == [
        "validation (cpu): not validated (2 checks not run on cpu: accuracy, kv-cache)"
    ]
    assert "Verdict: cpu ⚪ not validated (2 checks" in markdown_summary(blocked)


def test_write_report_keeps_the_single_result_call(tmp_path):
    result = full_result()
    path = write_report(result, tmp_path)
    assert path == tmp_path / "report.html"
    assert (tmp_path / "summary.md").read_text().startswith("### vLLM validation: ")
    page = path.read_text()
    for remote in ("http://", "https://", "<script", "<link", "<img"):
        assert remote not in page.replace("http://www.w3.org/2000/svg", "")


def test_report_renders_in_chromium_with_every_plot(tmp_path):
    spec = load_spec(NOVEL)
    dirs = write_files(tmp_path, [full_result("cpu"), full_result("b200", 1.7)])
    html = write_report(dirs, tmp_path, spec)
    t0 = time.perf_counter()
    # logprob, acceptance, throughput, TTFT, TPOT, KL, top-1, KV budget.
    assert_renders(html, screenshot_path("report-samples.png"), plots=8)
    print(f"chromium render + screenshot: {time.perf_counter() - t0:.1f} s")


def test_a_broken_page_is_caught_by_the_browser_check(tmp_path):
    """The browser check itself can fail: a console error and a fetch are seen."""
    bad = tmp_path / "bad.html"
    bad.write_text(
        "<html><body><svg class='plot' width='200' height='50'></svg>"
        "<img src='https://example.invalid/x.png'>"
        "<script>console.error('boom')</script></body></html>"
    )
    page = render_page(bad, tmp_path / "bad.png")
    assert "console.error: boom" in page.errors
    assert any("example.invalid" in url for url in page.requests)


# -- real engine ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def llama_validated(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("report-llama")
    ckpt = write_llama(root / "tiny-llama")
    spec = write_spec(root / "spec.yaml", LLAMA_SPEC)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            ONBOARD,
            "validate",
            str(ckpt),
            "--spec",
            str(spec),
            "--out",
            str(root / "out"),
            "--checks",
            "accuracy,kv-cache",
        ],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    print(f"\nvalidate (accuracy, kv-cache): {time.perf_counter() - t0:.1f} s")
    assert (root / "out" / "validation.json").exists(), proc.stdout + proc.stderr
    return root


@pytest.mark.engine
@pytest.mark.acceptance  # make test renders measured-shape samples in Chromium
def test_report_of_a_real_run(llama_validated):
    out = llama_validated / "out"
    data = json.loads((out / "validation.json").read_text())
    page = (out / "report.html").read_text()
    assert assert_numbers_match(page, [data]) > 50
    accuracy = next(c for c in data["checks"] if c["name"] == "accuracy")
    assert accuracy["status"] == "passed", accuracy["details"]
    diffs = [
        p["prompt_logprob_max_abs_diff"] for p in accuracy["metrics"]["per_prompt"]
    ]
    logprob_marks = [
        n
        for n in numbers(page)
        if n["path"].endswith("prompt_logprob_max_abs_diff")
        and "/per_prompt/" in n["path"]
        and n["tag"] == "rect"
    ]
    assert [float(n["value"]) for n in logprob_marks] == diffs
    # The spec's summary and the plan for its one target (cpu).
    assert "LlamaForCausalLM (model_type llama)" in page
    summary = (out / "summary.md").read_text()
    assert f"{fmt(accuracy['metrics']['prompt_logprob_max_abs_diff'])} nats" in summary
    # In the browser: logprob plot, KV budget (cpu plan), and the kv-cache check's
    # numbers if it ran; no spec-decode, quant or speed checks: "not measured".
    html = out / "report.html"
    keep(out, "tiny-llama")
    page_r = assert_renders(
        html, screenshot_path("report-tiny-llama.png"), plots=2, missing=4
    )
    assert page_r.title == "tiny-llama: vLLM validation report"


def expected_plots(data: dict) -> tuple[int, int]:
    """(SVG plots, "not measured" boxes) the page of one real run must show,
    from what its validation.json holds (the KV budget always has the plan)."""
    checks = {c["name"]: c for c in data["checks"]}
    has = {
        "logprob": bool(
            checks.get("accuracy", {}).get("metrics", {}).get("per_prompt")
        ),
        "acceptance": any(
            c["metrics"].get("acceptance_rate_per_position")
            for n, c in checks.items()
            if n.startswith("spec-decode:")
        ),
        "speed": bool(
            checks.get("speed", {}).get("metrics", {}).get("variants")
            or checks.get("speed", {}).get("metrics", {}).get("sweep")
        ),
        "quant": any(
            "kl_divergence" in c["metrics"]
            for n, c in checks.items()
            if n.startswith("quant:")
        ),
    }
    # Speed: throughput, TTFT, TPOT, and the engine's own TPOT where the sweep
    # carries it (cpu runs).
    engine_tpot = any(
        "engine_tpot_ms" in level
        for variant in checks.get("speed", {})
        .get("metrics", {})
        .get("variants", {})
        .values()
        for level in variant.get("sweep", [])
    )
    plots = has["logprob"] + has["acceptance"] + 3 * has["speed"] + 2 * has["quant"]
    plots += has["speed"] and engine_tpot
    missing = (not has["logprob"]) + (not has["acceptance"]) + 2 * (not has["speed"])
    return plots + 1, missing + (not has["quant"])


@pytest.mark.engine
@pytest.mark.acceptance
def test_report_of_a_real_run_with_speed_and_speculation(tmp_path):
    """validate with spec-decode:ngram and speed on the tiny Llama: the report's
    acceptance and throughput plots come from real measurements."""
    ckpt = write_llama(tmp_path / "tiny-llama")
    spec = write_spec(
        tmp_path / "spec.yaml",
        LLAMA_SPEC + "speculators:\n  - {method: ngram, num_speculative_tokens: 3}\n",
    )
    out = tmp_path / "out"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [
            ONBOARD,
            "validate",
            str(ckpt),
            "--spec",
            str(spec),
            "--out",
            str(out),
            "--checks",
            "accuracy,kv-cache,spec-decode:ngram,speed",
        ],
        capture_output=True,
        text=True,
        timeout=3000,
    )
    print(f"\nvalidate (4 checks): {time.perf_counter() - t0:.1f} s")
    assert (out / "validation.json").exists(), proc.stdout + proc.stderr
    data = json.loads((out / "validation.json").read_text())
    print({c["name"]: c["status"] for c in data["checks"]})
    page = (out / "report.html").read_text()
    assert assert_numbers_match(page, [data]) > 50
    plots, missing = expected_plots(data)
    keep(out, "tiny-llama-speed")
    assert_renders(
        out / "report.html",
        screenshot_path("report-tiny-llama-speed.png"),
        plots=plots,
        missing=missing,
    )
