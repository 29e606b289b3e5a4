"""Load testing: the arithmetic of the per-level table (literal arrays), the load shapes, the memory
trend of a soak, the report, and the smoke: `specpipe loadtest` starts `specpipe up --preset tiny`
and runs Locust headless with 4 users for 20 s; the run must have requests and no failure, and its
table must agree with Locust's CSV and with the per-request records."""

from __future__ import annotations

import csv
import json
import math
import os
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from specpipe.bench.loadshapes import (
    parse_levels,
    ramp_users,
    shape_users,
    spike_users,
    steps_users,
)
from specpipe.bench.loadstats import (
    OK,
    LevelSummary,
    RequestRecord,
    Slo,
    itl_per_token,
    level_windows,
    markdown_table,
    memory_trend,
    parse_slo,
    percentile,
    read_records,
    record_line,
    speculation_cell,
    summarize,
    token_times,
    within_slo,
)
from specpipe.core.errors import InvalidArgument

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("values, q, expected", [
    ([1, 2, 3, 4], 50, 2.5),
    ([4, 1, 3, 2], 0, 1),
    ([4, 1, 3, 2], 100, 4),
    ([10, 20], 99, 19.9),
    ([7], 99, 7),
    ([], 50, None),
])
def test_percentile(values, q, expected):
    result = percentile(values, q)
    assert result == (None if expected is None else pytest.approx(expected))


def test_percentile_out_of_range():
    with pytest.raises(InvalidArgument):
        percentile([1.0], 101)


def test_itl_per_token_splits_a_chunk_gap():
    assert itl_per_token(30.0, 3) == [10.0, 10.0, 10.0]
    assert itl_per_token(5.0, 0) == []


def record(users=1, start=0.0, end=1.0, status=OK, tokens=3, ttft=100.0, itl=(10.0, 20.0), prompt_id="p"):
    return RequestRecord(start_s=start, end_s=end, users=users, status=status, tokens=tokens, ttft_ms=ttft,
                         itl_ms=tuple(itl), prompt_id=prompt_id)


@pytest.mark.parametrize("case, expected", [
    (record(), True),                          # TTFT 100 <= 100, mean ITL 15 <= 15
    (record(ttft=100.5), False),               # TTFT over
    (record(itl=(10.0, 21.0)), False),         # mean ITL 15.5 over, though one token is fast
    (record(itl=()), True),                    # a single chunk: no ITL to hold against the SLO
    (record(status="UNAVAILABLE"), False),     # an error is never good
    (record(ttft=None, itl=(), tokens=0), False),
])
def test_within_slo(case, expected):
    assert within_slo(case, Slo(ttft_ms=100.0, itl_ms=15.0)) is expected


@pytest.mark.parametrize("text, expected", [
    ("ttft=500,itl=50", Slo(500.0, 50.0)),
    ("itl=20", Slo(math.inf, 20.0)),
    ("", Slo()),
])
def test_parse_slo(text, expected):
    assert parse_slo(text) == expected


@pytest.mark.parametrize("text", ["ttx=5", "ttft=abc", "ttft=-1", "ttft"])
def test_parse_slo_rejects(text):
    with pytest.raises(InvalidArgument):
        parse_slo(text)


def test_summarize_per_user_level():
    records = [
        record(users=1, start=0.0, end=1.0, tokens=3, ttft=100.0, itl=(10.0, 20.0)),
        record(users=1, start=1.0, end=2.0, tokens=3, ttft=300.0, itl=(30.0, 40.0)),
        record(users=2, start=2.0, end=3.0, tokens=2, ttft=50.0, itl=(5.0,)),
        record(users=2, start=2.0, end=4.0, tokens=1, ttft=60.0, itl=()),
        record(users=2, start=3.0, end=3.5, status="DEADLINE_EXCEEDED", tokens=0, ttft=None, itl=()),
    ]
    one, two = summarize(records, Slo(ttft_ms=200.0, itl_ms=30.0))
    assert (one.users, one.requests, one.tokens, one.seconds, one.tokens_per_s) == (1, 2, 6, 2.0, 3.0)
    assert (one.ttft_p50_ms, one.itl_p50_ms, one.e2e_p50_ms) == (200.0, 25.0, 1000.0)
    assert one.ttft_p99_ms == pytest.approx(298.0) and one.itl_p99_ms == pytest.approx(39.7)
    assert (one.good, one.goodput_rps, one.errors) == (1, 0.5, {})  # the second misses the TTFT SLO
    assert (two.users, two.requests, two.tokens, two.seconds, two.tokens_per_s) == (2, 3, 3, 2.0, 1.5)
    assert (two.ttft_p50_ms, two.itl_p50_ms) == (55.0, 5.0)  # the failed call has no latency to count
    assert (two.good, two.errors) == (2, {"DEADLINE_EXCEEDED": 1})
    table = markdown_table([one, two], Slo(ttft_ms=200.0, itl_ms=30.0))
    assert "| 2 | 3 | 1.5 | 55.0 / 59.9 | 5.0 / 5.0 | 1500 | 1.00 (2/3) | - | - | DEADLINE_EXCEEDED 1 |" in table


def test_speculation_per_level_from_the_rounds():
    spec = replace(record(tokens=10), rounds=4, plain_rounds=1, drafted=12, accepted=6)
    plain = replace(record(tokens=6), rounds=6, plain_rounds=6)
    failed = replace(record(status="CANCELLED", tokens=1), rounds=1, drafted=8)  # an error's rounds are not counted
    (level,) = summarize([spec, plain, failed], Slo())
    assert (level.tokens_per_round, level.plain_share, level.acceptance) == (1.6, 0.7, 0.5)
    assert speculation_cell(level) == "1.60 (70% plain, 50% accepted)"
    (none,) = summarize([plain], Slo())
    assert none.acceptance is None and speculation_cell(none) == "1.00 (100% plain)"
    (old,) = summarize([record()], Slo())  # records written before rounds were counted
    assert old.tokens_per_round is None and speculation_cell(old) == "-"
    assert "| 1 | 1 | 3.0 | 100 / 100 | 15.0 / 19.9 | 1000 | 1.00 (1/1) | - | - | 0 |" in markdown_table([old], Slo())


def test_the_orchestrator_s_time_per_level_from_the_rounds():
    """Each record adds up its rounds' parts (round_parts); a level splits its OK requests' time into
    prefill, the verifier's forwards, waiting for drafts and the rest."""
    from specpipe.bench.loadstats import round_parts, split_cell
    from specpipe.core.types import RoundStats

    stats = RoundStats(4, 2, draft_ms=1.0, verify_ms=70.0, prefill_ms=20.0, wait_ms=5.0, control_ms=1.0, call_ms=72.0,
                       emit_ms=1.0, record_ms=0.5, rest_ms=0.5)
    parts = round_parts(stats)
    assert parts["forward"] == 70.0 and parts["call"] == 72.0 and sum(parts.values()) == 100.0 + 70.0
    ok = replace(record(), rounds=1, part_ms=parts)
    failed = replace(record(status="CANCELLED"), rounds=1, part_ms=parts)  # not counted
    (level,) = summarize([ok, failed], Slo())
    assert level.time_split == pytest.approx({"prefill": 0.2, "forward": 0.7, "wait": 0.05, "other": 0.05})
    assert split_cell(level) == "20 / 70 / 5 / 5%"


def test_from_run_takes_the_run_s_own_flags(tmp_path, capsys):
    """--from-run summarises an earlier run again with the flags it ran with, kept in summary.json."""
    from specpipe.cli.main import main

    with open(tmp_path / "requests.jsonl", "w") as stream:
        stream.write(record_line(replace(record(ttft=300.0), rounds=2, plain_rounds=1, drafted=4, accepted=1)))
    argv = ["--preset", "qwen-coder", "--levels", "1", "--hold-s", "5", "--slo", "ttft=200", "--out", str(tmp_path)]
    (tmp_path / "summary.json").write_text(json.dumps({"argv": argv, "runs": {"default": []}}))
    doc = tmp_path / "load.md"
    doc.write_text("<!-- bench-report:load:begin -->\n<!-- bench-report:load:end -->\n")
    assert main(["loadtest", "--from-run", str(tmp_path), "--report", str(doc)]) == 0
    assert "| 1 | 1 | 3.0 | 300 / 300 | 15.0 / 19.9 | 1000 | 0.00 (0/1) | 1.50 (50% plain, 25% accepted) | - | 0 |" \
        in capsys.readouterr().out  # the run's TTFT SLO of 200 ms
    text = doc.read_text()
    assert f"Generated by `specpipe loadtest {' '.join(argv)}`: preset `qwen-coder`" in text
    assert "levels `1`, hold s `5`" in text
    assert main(["loadtest", "--from-run", str(tmp_path), "--slo", "ttft=500"]) == 0
    assert "| 1.00 (1/1) |" in capsys.readouterr().out  # an SLO given now replaces the run's


def test_aggregate_tokens_per_s_counts_what_arrived_while_a_level_ran():
    # level 1 runs 0-10 s, level 2 from 10 s; the level-1 request outlives its level
    long = RequestRecord(0.0, 14.0, 1, "OK", 5, ttft_ms=2000.0, itl_ms=(3000.0, 3000.0, 3000.0, 3000.0))
    late = RequestRecord(10.0, 20.0, 2, "OK", 2, ttft_ms=5000.0, itl_ms=(5000.0,))
    cut = RequestRecord(10.0, 20.0, 2, "UNAVAILABLE", 0)
    assert token_times(long) == [2.0, 5.0, 8.0, 11.0, 14.0]
    assert level_windows([late, long, cut]) == {1: (0.0, 10.0), 2: (10.0, 20.0)}
    one, two = summarize([long, late, cut], Slo())
    assert (one.tokens, one.seconds, one.tokens_per_s) == (3, 10.0, 0.3)  # tokens at 2, 5, 8 s
    assert (two.tokens, two.tokens_per_s) == (4, pytest.approx(0.4))     # 11, 14 (level 1's) + 15, 20
    assert two.requests == 2 and two.errors == {"UNAVAILABLE": 1} and two.ttft_p50_ms == 5000.0


def test_records_round_trip(tmp_path):
    path = tmp_path / "requests.jsonl"
    with open(path, "w") as stream:
        for r in (record(), record(status="UNAVAILABLE", ttft=None, itl=(), tokens=0)):
            stream.write(record_line(r))
    assert read_records(path) == [record(), record(status="UNAVAILABLE", ttft=None, itl=(), tokens=0)]


@pytest.mark.parametrize(
    "t, expected", [(0.0, 1), (9.9, 1), (10.0, 2), (25.0, 4), (49.9, 16), (50.0, None), (-1, None)]
)
def test_steps_hold_each_level(t, expected):
    assert steps_users(t, (1, 2, 4, 8, 16), hold_s=10.0) == expected


@pytest.mark.parametrize("t, expected", [(0.0, 1), (50.0, 8), (99.0, 15), (100.0, None)])
def test_ramp_rises_to_the_peak(t, expected):
    assert ramp_users(t, peak=16, duration_s=100.0) == expected


@pytest.mark.parametrize("t, expected", [(0.0, 2), (29.9, 2), (30.0, 16), (59.9, 16), (60.0, 2), (90.0, None)])
def test_spike_in_the_middle_third(t, expected):
    assert spike_users(t, base=2, peak=16, duration_s=90.0) == expected


def test_shape_users_spans_the_levels():
    assert shape_users("ramp", 15.0, (1, 4, 16), hold_s=10.0) == 8  # 1 -> 16 over 3 * 10 s
    assert shape_users("spike", 15.0, (1, 4, 16), hold_s=10.0) == 16
    with pytest.raises(InvalidArgument):
        shape_users("wave", 0.0, (1,), 1.0)


@pytest.mark.parametrize("text", ["", "1,x", "0,2", "-1"])
def test_parse_levels_rejects(text):
    with pytest.raises(InvalidArgument):
        parse_levels(text)


def test_memory_trend_flat_and_growing():
    flat = memory_trend([(t, 400.0 + (1.0 if t == 6 else 0.0)) for t in range(10)])  # one burst
    assert (flat.first_mb, flat.last_mb, flat.growth_mb, flat.peak_mb) == (400.0, 400.0, 0.0, 401.0)
    growing = memory_trend([(t, 100.0 + t) for t in range(13)], warmup_s=3.0)  # 1 MB/s after warm-up
    assert growing.slope_mb_per_min == pytest.approx(60.0)
    assert (growing.first_mb, growing.last_mb) == (4.0 + 100.0, 11.0 + 100.0)
    assert memory_trend([(0.0, 1.0), (1.0, 1.0)]) is None


def test_up_table_and_locust_command(tmp_path):
    from specpipe.bench.loadruns import LocustRun, locust_command, parse_up_table

    table = ("service       address          metrics  pid    core\n"
             "orchestrator  127.0.0.1:36527  43575    12064  -\n"
             "verifier      127.0.0.1:32861  34199    11809  -\n"
             "OpenAI-compatible API: http://127.0.0.1:41000/v1 (curl http://127.0.0.1:41000/v1/models)\n"
             "specpipe up: ready (preset tiny); logs in /tmp/x; Ctrl-C stops all services\n")
    assert parse_up_table(table) == ({"orchestrator": "127.0.0.1:36527", "verifier": "127.0.0.1:32861"},
                                     {"orchestrator": 12064, "verifier": 11809}, "http://127.0.0.1:41000",
                                     {"orchestrator": 43575, "verifier": 34199})
    constant = locust_command(LocustRun("h:1", tmp_path, "constant", 4, 20.0, "1,2", 5.0, ("--suite", "gsm8k")))
    assert constant[constant.index("-u") + 1] == "4" and constant[constant.index("-t") + 1] == "20s"
    assert "shapes.py" not in constant[constant.index("-f") + 1] and constant[-2:] == ["--suite", "gsm8k"]
    steps = locust_command(LocustRun("h:1", tmp_path, "steps", 4, 20.0, "1,2", 5.0))
    assert steps[steps.index("-f") + 1].endswith("shapes.py") and "-u" not in steps
    assert steps[steps.index("--levels") + 1] == "1,2" and steps[steps.index("--hold-s") + 1] == "5"
    assert "--processes" not in steps and "--load-processes" not in steps
    workers = locust_command(LocustRun("h:1", tmp_path, "steps", 4, 20.0, "2,4", 5.0, processes=2), master_port=6000)
    assert workers[workers.index("--processes") + 1] == workers[workers.index("--load-processes") + 1] == "2"
    assert workers[workers.index("--master-bind-port") + 1] == "6000"


def test_report_section_and_plots(tmp_path):
    from specpipe.bench.loadreport import (
        comparison_table,
        plot,
        report_markdown,
        write_report,
    )

    runs = {"none": [LevelSummary(users=1, requests=4, tokens=40, seconds=2.0, tokens_per_s=20.0, ttft_p99_ms=90.0,
                                  itl_p99_ms=12.5)],
            "model": [LevelSummary(users=1, requests=5, tokens=60, seconds=2.0, tokens_per_s=30.0, ttft_p99_ms=80.0,
                                   itl_p99_ms=10.0, errors={"UNAVAILABLE": 1})]}
    assert "| 1 | 20.0 | 30.0 | 1.50x | 90 | 80 | 12.5 | 10.0 | 1 |" in comparison_table(runs)
    doc = tmp_path / "load.md"
    doc.write_text("# Load\n<!-- bench-report:load:begin -->\nold\n<!-- bench-report:load:end -->\ntail\n")
    images = plot(runs, tmp_path / "load")
    assert all(p.stat().st_size > 0 for p in images)
    write_report(doc, report_markdown(runs, Slo(), {"preset": "tiny"}, images, tmp_path, "specpipe loadtest x"))
    text = doc.read_text()
    assert "old" not in text and text.endswith("tail\n") and "](load/load-tokens-per-s.png)" in text
    assert "Generated by `specpipe loadtest x`: preset `tiny`." in text
    assert [p.name for p in plot(runs, tmp_path / "load", "load-long")] == [  # another report's own plots
        "load-long-tokens-per-s.png", "load-long-p99-latency.png"]


def loadtest(tmp_path: Path, *flags: str, timeout_s: float = 300) -> tuple[subprocess.CompletedProcess, dict]:
    proc = subprocess.run([sys.executable, "-m", "specpipe.cli.main", "loadtest", "--out", str(tmp_path), "--json",
                           *flags], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)), check=False)
    assert proc.stdout.strip(), proc.stderr
    return proc, json.loads(proc.stdout)


def csv_rows(path: Path) -> dict[str, dict]:
    with open(path, newline="") as stream:
        return {row["Name"]: row for row in csv.DictReader(stream)}


@pytest.mark.slow  # `specpipe up` and Locust: 35 s; Locust runs in the default suite in the next test and test_tls.py
def test_smoke_tiny_4_users(tmp_path):
    proc, summary = loadtest(tmp_path, "--preset", "tiny", "--shape", "constant", "--users", "4", "--run-time", "8",
                             "--max-new-tokens", "32", "--prompt-limit", "5", "--slo", "ttft=60000,itl=60000",
                             "--itl-events", "token")
    assert proc.returncode == 0, proc.stderr
    stats = csv_rows(tmp_path / "locust_stats.csv")
    assert int(stats["Aggregated"]["Failure Count"]) == 0
    assert int(stats["e2e"]["Request Count"]) > 0
    assert (tmp_path / "locust.html").stat().st_size > 0
    assert list(csv_rows(tmp_path / "locust_failures.csv")) == []

    records = read_records(tmp_path / "requests.jsonl")
    (level,) = summary["runs"]["default"]
    assert level["users"] == 4 and level["requests"] == len(records) > 0 and level["errors"] == {}
    # Locust's own count and the records are the same calls; every call ran to its token budget
    assert int(stats["e2e"]["Request Count"]) == int(stats["ttft"]["Request Count"]) == len(records)
    assert all(r.status == OK and 0 < r.tokens <= 32 and len(r.itl_ms) < r.tokens for r in records)
    assert level["tokens"] == sum(r.tokens for r in records)
    assert int(stats["itl"]["Request Count"]) == sum(len(r.itl_ms) for r in records)
    assert level["tokens_per_s"] > 0 and level["good"] == level["requests"]  # the SLOs are a minute
    assert 0 < level["ttft_p50_ms"] <= level["ttft_p99_ms"] and 0 <= level["itl_p50_ms"] <= level["itl_p99_ms"]
    assert_rounds_counted(records)
    assert level["tokens_per_round"] == sum(r.tokens for r in records) / sum(r.rounds for r in records)


@pytest.mark.slow  # `specpipe up` and Locust: 40 s
def test_a_load_at_gpu_speed_reports_where_the_cpu_goes(tmp_path):
    """Through a `specpipe up` whose verifier and drafter are held to the packaged H200 curve: every level
    has the CPU of each service's hops and processes (the load generator's too) and the verifier's
    busy share, and the run names its clock."""
    proc, summary = loadtest(tmp_path, "--preset", "tiny", "--up-args", "--cost-model nvidia-h200-qwen-coder",
                             "--shape", "steps", "--levels", "2,4", "--hold-s", "6", "--max-new-tokens", "24",
                             "--prompt-limit", "5", "--load-processes", "2")  # the load generator's workers too
    assert proc.returncode == 0, proc.stderr
    (costs,) = summary["costs"].values()
    assert [c["users"] for c in costs] == [2, 4]
    for level in costs:
        assert 0 < level["busy_share"] <= 1.0 and level["tokens"] > 0 and level["forwards"] > 0
        hops = level["hop_cpu_s"]
        assert hops["orchestrator/orchestrator/call"] > 0 and hops["verifier/verifier/forward"] > 0
        assert {"orchestrator", "verifier", "drafter", "load generator"} <= set(level["process_cpu_s"])
    assert "NVIDIA H200" in next(iter(summary["clocks"].values()))


@pytest.mark.slow  # `specpipe up` and Locust: 30 s
def test_smoke_tiny_through_the_openai_api(tmp_path):
    """The same harness over the OpenAI-compatible API: server-sent events, tokens from the usage of
    every event, the same records and statistics (round statistics are the gRPC API's alone)."""
    proc, summary = loadtest(tmp_path, "--api", "openai", "--preset", "tiny", "--shape", "constant", "--users", "2",
                             "--run-time", "6", "--max-new-tokens", "32", "--prompt-limit", "5")
    assert proc.returncode == 0, proc.stderr
    records = read_records(tmp_path / "requests.jsonl")
    (level,) = summary["runs"]["default"]
    assert level["requests"] == len(records) > 0 and level["errors"] == {}
    assert all(r.status == OK and 0 < r.tokens <= 32 and len(r.itl_ms) < r.tokens and r.ttft_ms for r in records)
    assert level["tokens"] == sum(r.tokens for r in records) and level["tokens_per_s"] > 0


def assert_rounds_counted(records) -> None:
    """Each record counts its rounds: a round emits its accepted draft tokens and one more, at most."""
    for r in records:
        assert 1 <= r.rounds <= r.tokens and r.plain_rounds <= r.rounds and r.accepted <= r.drafted, r
        assert r.tokens <= r.accepted + r.rounds, r


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_errors_are_counted_by_grpc_status(tmp_path):
    """No server at the address: every call fails UNAVAILABLE, the run says so and exits 1."""
    proc, summary = loadtest(tmp_path, "--addr", f"127.0.0.1:{free_port()}", "--shape", "constant", "--users", "1",
                             "--run-time", "1", "--suite", "random", "--deadline-s", "1")
    assert proc.returncode == 1
    (level,) = summary["runs"]["default"]
    assert level["requests"] > 0 and level["errors"] == {"UNAVAILABLE": level["requests"]} and level["good"] == 0
    failures = csv_rows(tmp_path / "locust_failures.csv")
    assert [(name, f["Error"]) for name, f in failures.items()] == [("e2e", "StatusError('UNAVAILABLE')")]


def test_a_process_s_cpu_counts_its_children_running_and_ended():
    """The load generator's CPU (Locust's master) includes its workers', also once they have ended."""
    import psutil

    from specpipe.bench.loadruns import tree_cpu_s

    spin = "import time\nend = time.process_time() + 1.0\nwhile time.process_time() < end: pass"
    # the parent starts the child, then sleeps without reaping it (a zombie once it ends, as Locust's workers)
    parent = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time; "
                               f"subprocess.Popen([sys.executable, '-c', {spin!r}]); time.sleep(60)"])
    try:
        process, children = psutil.Process(parent.pid), {}
        deadline = time.monotonic() + 20
        while tree_cpu_s(process, children) < 1.0 and time.monotonic() < deadline:
            time.sleep(0.1)
        own = process.cpu_times()
        assert tree_cpu_s(process, children) >= 1.0 > own.user + own.system
        while any(c.status() != psutil.STATUS_ZOMBIE for c in process.children()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tree_cpu_s(process, children) >= 1.0  # ended, not reaped: its last reading stands
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()


def test_several_load_processes_split_the_users_and_record_the_whole_level(tmp_path):
    """--load-processes 2: Locust's two workers run a user each, append their records to one file (whole
    lines) and record the level as the load's 2 users, not their own 1."""
    proc, summary = loadtest(tmp_path, "--addr", f"127.0.0.1:{free_port()}", "--shape", "constant", "--users", "2",
                             "--run-time", "2", "--suite", "random", "--deadline-s", "1", "--load-processes", "2")
    assert proc.returncode == 1
    records = read_records(tmp_path / "requests.jsonl")  # every line parses
    (level,) = summary["runs"]["default"]
    assert level["users"] == 2 and {r.users for r in records} == {2}
    assert level["requests"] == len(records) > 0 and level["errors"] == {"UNAVAILABLE": len(records)}
    # Locust's own CSV (its master's sum of the workers' reports) drops a worker's last report, sent after the
    # master counts it stopped: the tables come from the records
    assert int(csv_rows(tmp_path / "locust_stats.csv")["Aggregated"]["Request Count"]) <= len(records)


@pytest.mark.slow
@pytest.mark.timeout(float(os.environ.get("SPECPIPE_SOAK_S", "600")) + 400)  # past pyproject's 600 s
def test_soak_memory_flat_and_no_errors(tmp_path):
    """SPECPIPE_SOAK_S (default 600) seconds of 4 steady users on the tiny preset, resident memory of
    each service sampled every 5 s: zero errors, and after a minute's warm-up memory is flat (the
    sessions of finished generations are released)."""
    seconds = float(os.environ.get("SPECPIPE_SOAK_S", "600"))
    proc, summary = loadtest(tmp_path, "--preset", "tiny", "--shape", "constant", "--users", "4", "--run-time",
                             f"{seconds:g}", "--max-new-tokens", "64", "--memory-every", "5", "--warmup-s",
                             f"{min(60.0, seconds / 4):g}", timeout_s=seconds + 300)
    assert proc.returncode == 0, proc.stderr
    (level,) = summary["runs"]["default"]
    assert level["requests"] > 0 and level["errors"] == {}
    for role, trend in summary["memory"].items():
        assert trend is not None, role
        assert trend["growth_mb"] < 32.0, (role, trend)


@pytest.mark.parametrize("flags, message", [
    (["--drafter", "none,fast"], "--drafter takes default, model, ngram, hybrid, none"),
    (["--report", "pyproject.toml"], "needs a Markdown file with a <!-- bench-report:load:begin -->"),
    (["--addr", "127.0.0.1:1", "--memory-every", "5"], "--memory-every samples the services"),
    (["--up-args=--pin", "--up-args", "b=--pin"], "needs a distinct LABEL=FLAGS each"),
    (["--up-args", "a=--pin", "--up-args", "a=--batching off"], "needs a distinct LABEL=FLAGS each"),
    (["--addr", "127.0.0.1:1", "--up-args=--pin"], "drop --addr"),
    (["--up-args", "a:fast=--pin", "--up-args", "b=--pin"], "--drafter takes default"),
    (["--load-processes", "2", "--shape", "constant", "--users", "3"], "every user count must be a multiple of it"),
    (["--load-processes", "2", "--levels", "2,3,4"], "got 3"),
    (["--load-processes", "2", "--shape", "ramp", "--levels", "2,4"], "a ramp passes through every user count"),
    (["--load-processes", "0"], "--load-processes must be at least 1"),
])
def test_loadtest_rejects_before_starting(flags, message, capsys):
    from specpipe.cli.main import main

    assert main(["loadtest", *flags]) == 2
    assert message in capsys.readouterr().err


def test_servers_compared_in_one_run_are_labelled():
    from specpipe.bench.loadreport import comparison_table
    from specpipe.bench.loadtest import server_configs

    both = ["none", "default"]
    assert server_configs(None, None, both) == {"": ("", both)}
    assert server_configs(["--pin --compile=on"], None, both) == {"": ("--pin --compile=on", both)}
    assert server_configs(["unbatched:default=--batching off --pin", "batched=--pin"], None, both) == {
        "unbatched": ("--batching off --pin", ["default"]), "batched": ("--pin", both)}
    level = LevelSummary(users=8, requests=4, tokens=40, seconds=2.0, tokens_per_s=10.0)
    runs = {"unbatched default": [level], "batched none": [replace(level, tokens_per_s=40.0)],
            "batched default": [replace(level, tokens_per_s=50.0)]}
    table = comparison_table(runs)
    assert "batched none / unbatched default | batched default / unbatched default | " \
           "batched default / batched none" in table
    assert "| 8 | 10.0 | 40.0 | 50.0 | 4.00x | 5.00x | 1.25x |" in table
    # Both servers with both drafters: batching at equal drafters, and each server's speculation.
    table = comparison_table({"unbatched none": [replace(level, tokens_per_s=5.0)], **runs})
    assert (
        "| unbatched default / unbatched none | batched none / unbatched none | batched default / unbatched none | "
        "batched default / batched none | batched default / unbatched default |" in table
    )
    assert "| 8 | 5.0 | 10.0 | 40.0 | 50.0 | 2.00x | 8.00x | 10.00x | 1.25x | 5.00x |" in table


def test_workload_flags_leave_server_defaults_out():
    from specpipe.bench.loadtest import workload_flags
    from specpipe.cli.loadtest_cmd import described

    config = described(["--suite", "gsm8k", "--temperature", "0.7", "--schedule", "branch"])
    default = workload_flags(config, "default")
    assert "--drafter" not in default and "--adaptive" not in default
    assert default[default.index("--schedule") + 1] == "branch" and default[default.index("--temperature") + 1] == "0.7"
    none = workload_flags(config, "none")
    assert none[none.index("--drafter") + 1] == "none" and none[none.index("--suite") + 1] == "gsm8k"


def test_the_recurring_workload_runs_each_server_learning_off_and_on():
    from specpipe.bench.loadreport import tokens_per_s_ratios
    from specpipe.bench.loadtest import LEARN_FLAG, learning_servers, server_configs, workload_flags
    from specpipe.cli.loadtest_cmd import described

    assert learning_servers(server_configs(["--pin"], None, ["default"])) == {
        "learn-off": (f"--pin {LEARN_FLAG} off", ["default"]), "learn-on": (f"--pin {LEARN_FLAG} on", ["default"])}
    assert list(learning_servers(server_configs(["a=--pin", "b:none="], None, ["default"]))) == [
        "a-learn-off", "a-learn-on", "b-learn-off", "b-learn-on"]
    flags = workload_flags(described(["--workload", "recurring", "--suite", "gsm8k"]), "default")
    assert flags[flags.index("--suite") + 1] == "recurring" and flags[flags.index("--prompt-limit") + 1] == "100"
    flags = workload_flags(described(["--prompt-limit", "7"]), "default")
    assert flags[flags.index("--suite") + 1] == "mix" and flags[flags.index("--prompt-limit") + 1] == "7"
    flags = workload_flags(described([]), "default")
    assert flags[flags.index("--prompt-limit") + 1] == "20"  # --prompt-limit's default: prompts per suite
    level = LevelSummary(users=2, requests=4, tokens=40, seconds=2.0, tokens_per_s=10.0)
    runs = {"learn-off default": [level, replace(level, users=4)],
            "learn-on default": [replace(level, tokens_per_s=15.0)]}
    assert tokens_per_s_ratios(runs) == {"learn-on default / learn-off default": {2: 1.5}}
