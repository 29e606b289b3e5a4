"""A serving benchmark nobody here wrote, NVIDIA's AIPerf (from the package index, with a local tokenizer
path: nothing from a model hub), drives the OpenAI-compatible API of a `specpipe up` unchanged: no
errors, and its tokens/s within 20% of `specpipe loadtest --api openai` on the same prompts, the same
concurrency and the same answer lengths, both computed the same way (tokens / (last answer's end -
first request's start), from each tool's per-request records).

AIPerf and its dependencies (pandas, pyarrow, datasets, ...) are not specpipe's: it is installed once
into a virtual environment of its own under $SPECPIPE_HOME/tools, or SPECPIPE_AIPERF names an aiperf
executable installed already."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

AIPERF = "aiperf==0.13.0"
USERS, SECONDS, ANSWER_TOKENS, PROMPTS_PER_SUITE = 2, 90, 64, 4
SUITES = ("humaneval", "mtbench", "gsm8k")  # the harness's mix, in its order


def aiperf_command() -> Path:
    from specpipe.config.env import environment

    given = os.environ.get("SPECPIPE_AIPERF")
    if given:
        return Path(given)
    venv = environment().home / "tools" / AIPERF.replace("==", "-")
    executable = venv / "bin" / "aiperf"
    if not executable.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", AIPERF], check=True)
    return executable


def harness_prompts(seed: int = 0) -> list[str]:
    """The prompts `specpipe loadtest --suite mix --prompt-limit PROMPTS_PER_SUITE --seed seed` sends
    (deploy/locust/locustfile.py's workload), in its order: each one user message."""
    from specpipe.bench.prompts import load_suite

    prompts = [p for name in SUITES for p in load_suite(name, limit=PROMPTS_PER_SUITE)]
    random.Random(seed).shuffle(prompts)
    assert all(len(p.messages) == 1 and p.messages[0][0] == "user" for p in prompts)
    return [p.messages[0][1] for p in prompts]


def tokens_per_s(records: list[tuple[float, float, int]]) -> float:
    """(start s, end s, tokens) per request -> the harness's aggregate: tokens / (last end - first start)."""
    seconds = max(end for _, end, _ in records) - min(start for start, _, _ in records)
    return sum(tokens for _, _, tokens in records) / seconds


def run_harness(url: str, out: Path) -> tuple[float, int]:
    """`specpipe loadtest --api openai`: (its tokens/s, its errors)."""
    proc = subprocess.run([sys.executable, "-m", "specpipe.cli.main", "loadtest", "--api", "openai", "--addr", url,
                           "--shape", "constant", "--users", str(USERS), "--run-time", str(SECONDS), "--suite", "mix",
                           "--prompt-limit", str(PROMPTS_PER_SUITE), "--max-new-tokens", str(ANSWER_TOKENS),
                           "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=SECONDS * 5, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (level,) = json.loads(proc.stdout)["runs"]["default"]
    return level["tokens_per_s"], sum(level["errors"].values())


def run_aiperf(url: str, tokenizer: Path, out: Path) -> tuple[float, int, dict]:
    """AIPerf at the same concurrency for as long, on the same prompts and answer lengths, greedy, the
    tokens of each answer from the server's usage (as the harness counts them): (tokens/s from its
    records, its errors, its own summary)."""
    prompts = out / "prompts.jsonl"
    out.mkdir(parents=True)
    prompts.write_text("".join(json.dumps({"text": text}) + "\n" for text in harness_prompts()))
    proc = subprocess.run(
        [str(aiperf_command()), "profile", "--model", "smollm2-135m", "--url", url, "--endpoint-type", "chat",
         "--streaming", "--tokenizer", str(tokenizer), "--input-file", str(prompts), "--custom-dataset-type",
         "single_turn", "--dataset-sampling-strategy", "sequential",  # the harness's order
         "--concurrency", str(USERS), "--benchmark-duration", str(SECONDS),
         "--output-tokens-mean", str(ANSWER_TOKENS), "--use-legacy-max-tokens", "--use-server-token-count",
         "--per-chunk-usage", "--extra-inputs", "temperature:0", "--artifact-dir", str(out), "--ui-type", "none",
         # a client as light as it goes (the server's cores are few): one worker, one record processor, no
         # scraping of GPU or server metrics
         "--workers-max", "1", "--record-processors", "1", "--no-gpu-telemetry", "--no-server-metrics"],
        capture_output=True, text=True, timeout=SECONDS * 10, env={**os.environ, "HF_HUB_OFFLINE": ""}, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:]
    summary = json.loads((out / "profile_export_aiperf.json").read_text())
    records = [json.loads(line) for line in (out / "profile_export.jsonl").read_text().splitlines()]
    profiled = [r for r in records if r["metadata"].get("benchmark_phase", "profiling") == "profiling"]
    errors = sum(1 for r in profiled if r.get("error"))
    timed = [(r["metadata"]["request_start_ns"] / 1e9, r["metadata"]["request_end_ns"] / 1e9,
              r["metrics"]["usage_completion_tokens"]["value"]) for r in profiled if not r.get("error")]
    return tokens_per_s(timed), errors, summary


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_aiperf_agrees_with_the_harness(tmp_path):
    from specpipe.bench.loadruns import start_up
    from specpipe.models import packaged

    packaged.prepare("smollm2-135m", progress=False)
    # the prompts repeat: with finished answers learned, whichever tool ran second would be drafted from
    # the first one's answers (docs/load.md); without, every request stands alone
    stack = start_up(["--preset", "smollm2", "--learn-global", "off"], tmp_path / "up", timeout_s=600)
    try:
        url = stack.http_url
        for text in harness_prompts()[:2]:  # warm: the first requests pay for the caches
            httpx.post(f"{url}/v1/chat/completions", timeout=300, json={
                "model": "smollm2-135m", "messages": [{"role": "user", "content": text}], "max_tokens": 8})
        harness, harness_errors = run_harness(url, tmp_path / "harness")
        aiperf, aiperf_errors, summary = run_aiperf(url, packaged.model_path("smollm2-135m"), tmp_path / "aiperf")
    finally:
        stack.stop()
    print(f"tokens/s: harness {harness:.1f}, AIPerf {aiperf:.1f} from its records "
          f"({summary['output_token_throughput']['avg']:.1f} by its own summary); "
          f"{summary['request_count']['avg']:.0f} AIPerf requests")
    assert harness_errors == 0 and aiperf_errors == 0 and not summary.get("error_summary")
    assert abs(aiperf / harness - 1) <= 0.2, (aiperf, harness)
