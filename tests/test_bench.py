"""`specpipe bench`: transformers baselines (the verifier alone on one core and on all, assisted
generation with the same drafter, prompt lookup) beside specpipe's methods in one run, each checked
token for token against the verifier alone; bad flags are refused."""

import json
import os
import subprocess
import sys

import pytest

import specpipe


def bench(*argv, timeout=300):
    return subprocess.run([sys.executable, "-m", "specpipe.cli.main", "bench", "--preset", "tiny", *argv],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow  # every baseline on the tiny preset, then --report
def test_transformers_baselines_beside_specpipe(tmp_path):
    from specpipe.bench.methods import default_learning

    out = tmp_path / "bench.json"
    proc = bench(
        "--limit",
        "2",
        "--max-new-tokens",
        "12",
        "--no-pin",
        "--methods",
        "model:sequential/4,ngram/6+adaptive,ngram",
        "--baselines",
        "prompt-lookup,assisted,generate-threads",
        "--prompt-lookup-tokens",
        "3,10",
        "--verifier-weights",  # transformers' exact model: its speculation is lossless there (a W4A8 one: below)
        "fp32",
        "--json",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    methods = {m["method"]: m for m in json.loads(out.read_text())["methods"]}
    threads = next(name for name in methods if name.startswith("verifier-only generate(), "))
    where = threads.removeprefix("verifier-only generate(), ")
    assert where.endswith(" threads, packed")  # --compile auto on a host with a C compiler: specpipe's weights path
    learning = " learning" if default_learning() else ""  # the n-gram methods learn as the orchestrator does
    assert list(methods) == [
        "verifier-only generate()", threads, f"transformers assisted generation, {where}",
        f"transformers prompt lookup (3 tokens), {where}", f"transformers prompt lookup (10 tokens), {where}",
        "specpipe verifier alone compiled", "specpipe model k=4 width=1 sequential",
        f"specpipe ngram adaptive k<=6 width=1 branch calibrated M<=1{learning}",
        f"specpipe ngram adaptive k<=8 width=1 branch calibrated M<=1{learning}"]  # the default configuration
    assert all(m["identical"] == 2 for m in methods.values())
    assert methods["verifier-only generate()"]["tokens_per_round"] == 1.0
    assert (
        methods[f"transformers assisted generation, {where}"]["tokens_per_round"] == 0.0
    )  # not known inside generate()
    assert "| transformers assisted generation, " in proc.stdout and "lossless check: every output" in proc.stdout
    ours = methods["specpipe model k=4 width=1 sequential"]
    assert 0 < ours["acceptance_by_position"][0] <= 1 and ours["bound"] > 0 and ours["bound_share"] > 0
    assert ours["verify_share"] + ours["draft_share"] + ours["other_share"] == pytest.approx(1.0, abs=1e-6)

    # --report regenerates a README's results section, with plots, from the JSON file
    readme = tmp_path / "README.md"
    readme.write_text("# Results\n<!-- bench-report:begin -->\nold\n<!-- bench-report:end -->\ntail\n")
    proc = bench("--report", str(out), "--readme", str(readme), "--plot-dir", str(tmp_path / "plots"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = readme.read_text()
    assert "old" not in text and text.endswith("<!-- bench-report:end -->\ntail\n")
    assert "| humaneval (2) | default configuration |" in text and "![speedup](plots/speedup.png)" in text
    assert {p.name for p in (tmp_path / "plots").iterdir()} == {"speedup.png", "tokens-per-round.png", "time-split.png"}

    # ... or another section, from runs of other presets
    other = tmp_path / "other.json"
    data = json.loads(out.read_text())
    data["meta"] |= {"suite": "noise", "preset": "smollm2", "machine": "another host", "cpu_count": 4}
    other.write_text(json.dumps(data))
    readme.write_text(text + "<!-- bench-report:two:begin -->\n<!-- bench-report:two:end -->\n")
    proc = bench("--report", str(out), str(other), "--readme", str(readme), "--section", "two", "--plot-dir",
                 str(tmp_path / "plots-two"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert readme.read_text().startswith(text)
    assert "presets `tiny` (humaneval), `smollm2` (noise)" in readme.read_text()[len(text):]
    assert "; noise on another host (4 cores; " in readme.read_text()[len(text):]  # each suite's host


@pytest.mark.parametrize("argv, message", [
    (["--baselines", "generate,vllm"], "unknown baselines ['vllm']"),
    (["--report", "/no/such/result.json"], "bench result /no/such/result.json does not exist"),
    (["--methods", "model:branch+fast"], "[/K][+adaptive][+learn|+no-learn][@HOP_MS]"),
    (["--methods", "model:branch/0"], "[/K][+adaptive][+learn|+no-learn][@HOP_MS]"),
    (["--baselines", "llama-cpp"], "the llama-cpp baseline reads a packaged model's GGUF file; 'tiny' is not one"),
])
def test_bad_bench_flags(cli, argv, message):
    code, stderr = cli("bench", "--preset", "tiny", *argv)
    assert code != 0 and message in stderr, stderr


@pytest.mark.slow  # each loads the models first, in a process of its own (bench pins it and sets its threads)
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--prompts", "/no/such/file.jsonl"], "does not exist"),
        (
            ["--suite", "humaneval", "--turns", "2", "--limit", "1", "--no-pin"],
            "--turns 2 needs prompts with a second turn",
        ),
    ],
)
def test_bad_bench_flags_found_after_loading(argv, message):
    proc = bench(*argv, timeout=60)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


@pytest.mark.slow  # smollm2 and llama-cpp-python (the llama extra, which .ci/run installs)
def test_llama_cpp_baselines_on_the_verifiers_gguf(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, "-m", "specpipe.cli.main", "bench", "--preset", "smollm2", "--suite",
                           "humaneval", "--limit", "2", "--max-new-tokens", "12", "--no-pin", "--baselines",
                           "llama-cpp", "--prompt-lookup-tokens", "2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    methods = {m["method"]: m for m in json.loads(out.read_text())["methods"]}
    plain = next(name for name in methods if name.startswith("llama.cpp plain, "))
    lookup = plain.replace("plain", "prompt lookup (2 tokens)")
    assert plain.endswith(" threads, smollm2-135m GGUF") and lookup in methods
    # another computation: compared with specpipe's verifier alone (and prompt lookup with llama.cpp's plain
    # decoding), reported, left out of the lossless check
    assert methods[plain]["reference"] == "specpipe verifier alone compiled" and methods[lookup]["reference"] == plain
    assert all(0 < methods[m]["tokens"] <= 2 * 12 and 0 <= methods[m]["identical"] <= 2 for m in (plain, lookup))
    assert methods[plain]["tokens_per_round"] == 1.0 and methods[lookup]["tokens_per_round"] == 0.0
    assert "lossless check: every output is identical" in proc.stdout

    readme = tmp_path / "README.md"
    readme.write_text("<!-- bench-report:begin -->\n<!-- bench-report:end -->\n")
    proc = bench("--report", str(out), "--readme", str(readme), "--plot-dir", str(tmp_path / "plots"), timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "| over llama.cpp | over llama.cpp's prompt lookup (best setting) |" in readme.read_text()


@pytest.mark.slow  # smollm2 and llama-cpp-python (the llama extra)
def test_llama_cpp_worker_runs_without_torch():
    from specpipe.bench.llamacpp import LlamaWorker, gguf_of

    worker = LlamaWorker(gguf_of("smollm2-135m"), 1, 5, eos_token_ids=(), cores=[])
    try:
        maps = open(f"/proc/{worker.process.pid}/maps").read()
        assert "libggml" in maps and "torch" not in maps  # llama.cpp's OpenMP on the libgomp it was built with
        environ = open(f"/proc/{worker.process.pid}/environ", "rb").read().split(b"\0")
        assert not any(v.startswith(b"OMP_WAIT_POLICY=") for v in environ) or specpipe.CALLER_OMP_WAIT_POLICY
        run = worker("p0", [1, 2, 3, 4])
        assert run.prompt_id == "p0" and len(run.token_ids) == 5 and run.rounds == 5 and run.seconds > 0
    finally:
        worker.close()
    assert worker.process.returncode == 0


@pytest.mark.parametrize("caller", [None, "ACTIVE"])
def test_a_llama_cpp_worker_gets_the_callers_openmp_wait_policy(monkeypatch, caller):
    """specpipe's own OpenMP setting (made before torch loads) is not llama.cpp's: its worker gets the caller's."""
    from specpipe.bench.llamacpp import worker_environment

    assert os.environ["OMP_WAIT_POLICY"] == (specpipe.CALLER_OMP_WAIT_POLICY or "PASSIVE")
    monkeypatch.setattr(specpipe, "CALLER_OMP_WAIT_POLICY", caller)
    assert worker_environment().get("OMP_WAIT_POLICY") == caller
    assert worker_environment()["PATH"] == os.environ["PATH"]


def test_a_dead_llama_cpp_worker_fails_the_run_with_its_words(tmp_path):
    from specpipe.bench.llamacpp import LlamaWorker

    with pytest.raises(RuntimeError, match=r"llama.cpp's worker died \(exit code 1\) while loading the GGUF: .+"):
        LlamaWorker(tmp_path / "missing.gguf", 1, 4, eos_token_ids=(2,), cores=[])


def test_llama_cpp_rows_compare_with_the_verifier_alone():
    from specpipe.bench.llamacpp import llama_cpp_references

    plain, lookup = "llama.cpp plain, 2 threads, m GGUF", "llama.cpp prompt lookup (2 tokens), 2 threads, m GGUF"
    names = ["verifier-only generate()", plain, lookup, "specpipe verifier alone compiled"]
    assert llama_cpp_references(names, "specpipe verifier alone compiled") == {
        plain: "specpipe verifier alone compiled", lookup: plain}
    assert llama_cpp_references(names[:2], "verifier-only generate()") == {plain: "verifier-only generate()"}


def test_the_lossless_verdict_is_specpipes_and_names_transformers_differences():
    from specpipe.bench.command import lossless_check
    from specpipe.bench.measure import MethodSpec, MethodSummary

    spec = MethodSpec("ngram", "branch", "calibrated", 8, 1, 1, "on", compiled=True)

    def summary(name, identical, spec=None):
        return MethodSummary(name, 8, 2.0, 4.0, 1.0, 1.0, 0.0, identical, 2, spec=spec)

    packed = "verifier-only generate(), 2 threads, packed w4a8"
    alone = "specpipe verifier alone compiled"
    runs = [summary("verifier-only generate()", 2), summary(packed, 0), summary(alone, 0, spec),
            summary("llama.cpp plain, 2 threads, m GGUF", 1), summary("specpipe ngram", 2, spec)]
    # the verifiers alone are yardsticks (another model than eager's: 0/2), llama.cpp another computation
    assert lossless_check(runs, {packed, alone}) == (
        True, "lossless check: every output is identical to the verifier-only output run the same way")
    ok, verdict = lossless_check([*runs, summary("transformers prompt lookup (4 tokens), 2 threads, packed w4a8", 1)],
                                 {packed, alone})
    assert ok and verdict.startswith("lossless check: every specpipe output is identical") and \
        verdict.endswith("(outputs equal to its generate() on them: transformers prompt lookup (4 tokens), "
                         "2 threads, packed w4a8 1/2)")
    assert lossless_check([*runs, summary("specpipe model", 1, spec)], {packed, alone})[0] is False


def test_report_section_needs_its_markers():
    from specpipe.bench.report import replace_section

    assert replace_section("a<!-- bench-report:begin -->x<!-- bench-report:end -->b", "new") == \
        "a<!-- bench-report:begin -->\nnew\n<!-- bench-report:end -->b"
    with pytest.raises(ValueError, match="no <!-- bench-report:begin -->"):
        replace_section("no markers here", "new")
    both = ("<!-- bench-report:begin -->x<!-- bench-report:end -->"
            "<!-- bench-report:poor:begin -->y<!-- bench-report:poor:end -->")
    assert (
        replace_section(both, "new", "poor")
        == "<!-- bench-report:begin -->x<!-- bench-report:end -->"
        "<!-- bench-report:poor:begin -->\nnew\n<!-- bench-report:poor:end -->"
    )


# A full bench run of both MT-Bench turns (the default suite keeps test_transformers_baselines_beside_specpipe).
@pytest.mark.slow
def test_mtbench_second_turns_and_categories(tmp_path):
    out = tmp_path / "mt.json"
    proc = bench("--suite", "mtbench", "--turns", "2", "--limit", "2", "--max-new-tokens", "8", "--no-pin",
                 "--methods", "model:sequential", "--json", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(out.read_text())
    ids = [r["prompt_id"] for r in data["methods"][0]["runs"]]
    assert ids == ["mtbench/81", "mtbench/91", "mtbench/81/turn2", "mtbench/91/turn2"]
    assert data["meta"]["categories"] == {"mtbench/81": "writing", "mtbench/91": "roleplay",
                                          "mtbench/81/turn2": "writing", "mtbench/91/turn2": "roleplay"}
    # every output its verifier alone's; those are other models than eager generate()'s (W4A8)
    alone = ("verifier-only generate(), ", "specpipe verifier alone")
    assert all(m["identical"] == 4 for m in data["methods"] if not m["method"].startswith(alone))
    proc = bench("--report", str(out), "--plot-dir", str(tmp_path / "plots"), timeout=120)
    assert "| category | prompts |" in proc.stdout and "| roleplay | 2 |" in proc.stdout, proc.stderr[-2000:]


def test_sweep_table_pairs_adaptive_with_the_best_fixed_draft_length():
    from specpipe.bench.measure import MethodSpec, MethodSummary
    from specpipe.bench.report import sweep_table

    def summary(tokens_per_s, drafter="model", k=0, schedule="branch", adaptive="off"):
        spec = MethodSpec(drafter, schedule, "calibrated", k, 1, 1, adaptive) if k else None
        return MethodSummary(spec.name() if spec else "verifier-only generate()", 0, 0.0, tokens_per_s, 0.0, 0.0, 0.0,
                             0, 0, spec=spec)

    table = sweep_table([summary(1.0), summary(5.0, k=2), summary(6.0, k=6),
                         summary(9.0, k=8, schedule="sequential"),  # another schedule
                         summary(5.7, k=8, adaptive="on"), summary(7.0, "hybrid", k=8, adaptive="on")])
    assert table.splitlines()[2:] == [
        "| specpipe model adaptive k<=8 width=1 branch calibrated M<=1 | 6 | 6.00 | 5.70 | 0.95 |"]
    assert sweep_table([summary(5.0, k=2, schedule="sequential")]) == ""


def test_speedup_bound_from_acceptance_by_position_and_costs():
    from specpipe.bench.measure import speedup_bound

    # no draft pays: the verifier alone (k = 0) at its own cost is the bound
    assert speedup_bound([0.0, 0.0], t_1=100, draft_ms=10, verify_ms=100, overlapped=False) == pytest.approx(1.0)
    # E(2) = 1 + 0.9 + 0.72 = 2.62 tokens for 2 * 10 + 100 ms, against 100 ms per token alone
    assert speedup_bound([0.9, 0.8], 100, 10, 100, False) == pytest.approx(2.62 * 100 / 120)
    # overlapped drafting hides the draft time behind the verification
    assert speedup_bound([0.9, 0.8], 100, 10, 100, True) == pytest.approx(2.62)
    # a slow drafter: the best k is 1, not the longest
    assert speedup_bound([0.9, 0.1], 100, 20, 100, False) == pytest.approx(1.9 * 100 / 120)


def test_the_bound_with_a_verify_cost_per_draft_length():
    """The GPU report's bound (scripts/gpu_report.py): verifying k drafts costs T(k + 1) off a curve."""
    from specpipe.bench.measure import best_draft_len

    curve = {1: 100.0, 2: 110.0, 3: 300.0}  # a third token is dear
    bound, k = best_draft_len([0.9, 0.8], 100, 0.0, lambda k: curve[k + 1], overlapped=False)
    assert (bound, k) == (pytest.approx(1.9 * 100 / 110), 1)  # E(2) * 100 / 300 = 0.87 loses to k = 1
    assert best_draft_len([0.0], 100, 0.0, lambda k: curve[k + 1], False) == (pytest.approx(1.0), 0)


def test_the_runs_bound_prices_longer_drafts_by_the_verify_cost_line():
    """A run's bound verifies k drafts at the line through the verifier alone's forward and the run's
    mean verification, not at the mean: here half the rounds verify 8 drafts, half none."""
    from dataclasses import replace

    from specpipe.bench.measure import PromptRun, decode_bound, summarize, verify_cost
    from specpipe.bench.report import from_json, to_json

    alone = [PromptRun("p", 5, (1,) * 10, 0.1, rounds=10, verify_ms=100.0)]  # 10 ms a token, all forward
    drafted, accepted = (8, 0) * 5, (8, 0) * 5  # every draft token accepted: a_1..a_8 = 1
    runs = [PromptRun("p", 5, (1,) * 50, 0.1, rounds=10, drafted=40, accepted=40, verify_ms=140.0,
                      round_drafted=drafted, round_accepted=accepted)]
    line = verify_cost(runs, alone)
    assert [line(k) for k in (0, 4, 8)] == [pytest.approx(10.0), pytest.approx(14.0), pytest.approx(18.0)]
    bound, share = decode_bound(runs, alone)
    assert bound == pytest.approx(
        9 * 10 / 18
    )  # E(8) = 9 tokens for one 18 ms verification (the mean's 14 would say 6.43)
    assert share == pytest.approx((50 / 0.1) / (10 / 0.1) / bound)
    # cheaper than the verifier alone on average (noise): the forward's cost for every k
    assert verify_cost([PromptRun("p", 5, (1,), 0.1, rounds=10, drafted=10, verify_ms=90.0)], alone)(8) == 10.0
    # a reference without forwards of its own (transformers' generate()): the run's mean for every k
    assert verify_cost(runs, [PromptRun("p", 5, (1,) * 10, 0.1)])(8) == 14.0
    # a report of a file written with the old bound shows the bound as computed now
    written = to_json([summarize("alone", alone, None),
                       replace(summarize("ours", runs, None, ("alone", alone)), bound=6.43, bound_share=0.1)], {})
    assert from_json(written)[1].bound == pytest.approx(bound)


def test_headline_is_the_default_configuration_and_else_labelled():
    from specpipe.bench.measure import MethodSpec, MethodSummary, PromptRun
    from specpipe.bench.report import from_json, headline, is_default, spread, summary_table, to_json
    from specpipe.core.types import SpeculationOptions

    d = SpeculationOptions()
    default = MethodSpec(d.drafter, d.schedule, d.predictor, d.draft_len, d.width, d.hypotheses, d.adaptive,
                         compiled=True)
    fixed = MethodSpec("model", "branch", "calibrated", 4, 1, 1, "off", compiled=True)

    def summary(name, tokens_per_s, spec=None, seconds=(1.0, 2.0)):
        runs = [PromptRun(str(i), 3, (1,) * 4, s) for i, s in enumerate(seconds)]
        return MethodSummary(name, 8, sum(seconds), tokens_per_s, 1.0, 1.0, 0.0, 2, 2, spec=spec, runs=runs,
                             bound=2.0 if spec else 0.0, bound_share=0.5 if spec else 0.0,
                             default=is_default(spec, d))

    base = summary("verifier-only generate()", 1.0, seconds=(4.0, 4.0))
    fair = summary("verifier-only generate(), 2 threads, packed", 2.0, seconds=(2.0, 2.0))
    runs = [base, fair, summary("specpipe fast", 5.0, fixed), summary("specpipe default", 3.0, default)]
    assert headline(runs)[0].method == "specpipe default"
    assert headline(runs[:3]) == (runs[2], "fastest of 1 configurations: specpipe fast")
    assert spread([1.0, 3.0, 2.0]) == "2.00x (1.00-3.00)" and spread([]) == "-"
    row = summary_table({"humaneval": runs}).splitlines()[2]
    # per prompt over the fair baseline: 2.0 / 1.0 and 1.0 / 1.0
    assert row.startswith("| humaneval (2) | default configuration | 3.00 | - | 3.00x | 1.50x | 1.50x (1.00-2.00) |")
    assert "| 1.50x (verifier-only generate()) |" in row  # over the best transformers method of the run
    # the recurring suite runs the default configuration learning and not: the headline learns as the default does
    from dataclasses import replace

    from specpipe.bench.methods import default_learning

    both = [summary("specpipe default, learning", 4.0, replace(default, learn_global=True)),
            summary("specpipe default, not learning", 3.0, replace(default, learn_global=False))]
    assert headline([base, *both])[0] is both[0 if default_learning() else 1]
    # the default is the models': with a drafter of their own, the hybrid (the bench marks it), and a
    # file from before the mark reads the n-gram drafter's as the default
    hybrid = summary("specpipe hybrid", 3.5, replace(default, drafter="hybrid"))
    ours = headline([base, replace(runs[3], default=False), replace(hybrid, default=True)])
    assert ours == (replace(hybrid, default=True), "default configuration")
    old = to_json([base, runs[3], hybrid], {})
    for m in old["methods"]:
        del m["default"]
    assert [s.default for s in from_json(old)] == [False, True, False]


def test_time_parts_add_up_to_the_wall_time():
    """A generation's RoundStats split its wall time (ROUND_PARTS); the bench's TIME_PARTS regroup
    them: drafting is what the orchestrator waited of the drafter's own time, the calls' other time
    and everything else is orchestration, and the parts add up to the wall time."""
    from specpipe.bench.measure import ORCHESTRATION, TIME_PARTS, time_parts
    from specpipe.core.types import RoundStats

    rounds = [RoundStats(4, 2, draft_ms=3.0, verify_ms=40.0, prefill_ms=100.0, wait_ms=4.0, control_ms=0.5,
                         call_ms=42.0, emit_ms=0.2, record_ms=0.3, rest_ms=0.1),
              RoundStats(4, 4, draft_ms=5.0, verify_ms=41.0, hidden_ms=4.0, wait_ms=2.0, call_ms=43.0)]
    parts = time_parts(rounds, wall_ms=250.0)
    assert tuple(parts) == TIME_PARTS
    assert parts["prefill"] == 100.0 and parts["forward"] == 81.0
    assert parts["draft"] == 3.0 + 1.0  # round 2: 5 ms of drafting, 4 of them hidden behind the verification before
    assert parts["draft_call"] == 6.0 - 4.0 and parts["verify_call"] == 2.0 + 2.0
    assert sum(parts.values()) == pytest.approx(250.0)
    assert parts["rest"] == pytest.approx(250.0 - 100.0 - 81.0 - 4.0 - 2.0 - 4.0 - 0.5 - 0.2 - 0.3)
    assert set(ORCHESTRATION) == set(TIME_PARTS) - {"prefill", "forward", "draft"}


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_a_generation_reports_where_its_time_went(tiny_tokenizer, tiny_verifier, tiny_drafter, drafter):
    """Every round's parts are measured: they add up to the generation's wall time as its consumer
    saw it, the prefill is the first round's, and every round has its verifier's forward."""
    import time

    from cache_service.memory import InMemoryNgramCache
    from specpipe.bench.measure import time_parts
    from specpipe.core.types import ROUND_PARTS, GenerationRequest, SpeculationOptions
    from tests.test_golden_ngram import generator_with

    generator = generator_with(InMemoryNgramCache(), tiny_tokenizer, tiny_verifier, tiny_drafter)
    ids = generator.encode(prompt="def fibonacci(n):")
    start = time.perf_counter()
    chunks = list(generator.generate(GenerationRequest(ids, 24, speculation=SpeculationOptions(drafter, 4))))
    wall_ms = (time.perf_counter() - start) * 1e3
    rounds = [c.round for c in chunks]
    accounted = sum(getattr(r, f"{part}_ms") for r in rounds for part in ROUND_PARTS)
    assert 0.8 * wall_ms <= accounted <= wall_ms  # the rest: validation before the first round, release after the last
    assert rounds[0].prefill_ms > 0 and all(r.prefill_ms == 0 for r in rounds[1:])
    # a round is sent before the consumer takes the last one's tokens, so its forward may run while the
    # consumer works, and the call then waits for less than the forward (never for nothing measured)
    assert all(r.verify_ms > 0 and r.call_ms >= 0 for r in rounds)
    parts = time_parts(rounds, wall_ms)
    assert sum(parts.values()) == pytest.approx(wall_ms)
    assert 0 < parts["draft"] <= sum(r.wait_ms for r in rounds)  # the drafter's own time, of what was waited


def test_transformers_baselines_split_prefill_from_decoding(tiny_verifier, tiny_tokenizer):
    """The first tokens generate() hands its streamer end its prefill: plain generate() one token,
    prompt lookup its first round's; decode tokens/s counts the tokens after them over the time after."""
    from specpipe.bench.measure import decode_throughput, transformers_method

    ids = tuple(tiny_tokenizer("def fibonacci(n):")["input_ids"])
    eos = [tiny_verifier.model.generation_config.eos_token_id or -1]
    plain = transformers_method(tiny_verifier.model, 16, eos)("p", ids)
    assert plain.prefill_tokens == 1 and 0 < plain.prefill_ms < plain.seconds * 1e3
    assert decode_throughput([plain]) == pytest.approx((len(plain.token_ids) - 1) / plain.decode_seconds)
    lookup = transformers_method(tiny_verifier.model, 16, eos, plain=False, prompt_lookup_num_tokens=4)("p", ids)
    assert lookup.token_ids == plain.token_ids and 1 <= lookup.prefill_tokens <= 5
