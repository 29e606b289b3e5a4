"""The pipeline's own cost (specpipe.bench.pipecost, specpipe.runtime.cpu): level windows over
counter samples, and hops that charge a thread's CPU time where it was spent."""

from __future__ import annotations

import time

import pytest

from specpipe.bench.pipecost import CPU_COUNTER, Sample, at, level_cost, level_costs, markdown_table, parse_counters
from specpipe.runtime import cpu, metrics


def key(name, **labels):
    return name, tuple(sorted(labels.items()))


def sample(t, tokens, forward_s, loop_s, verify_s, orchestrator_cpu, verifier_cpu, load_cpu):
    return Sample(t, {
        "orchestrator": {key("specpipe_emitted_tokens_total", drafter="none"): tokens,
                         key("specpipe_rounds_total", drafter="none"): tokens,
                         key(CPU_COUNTER, role="orchestrator", hop="rest"): loop_s},
        "verifier": {key("specpipe_forward_seconds_total", role="verifier"): forward_s,
                     key("specpipe_forwards_total", role="verifier"): tokens / 4,
                     key(CPU_COUNTER, role="verifier", hop="verify"): verify_s},
    }, {"orchestrator": orchestrator_cpu, "verifier": verifier_cpu, "load generator": load_cpu})


SAMPLES = [sample(100.0, 0, 0.0, 0.0, 0.0, 1.0, 2.0, 0.5),
           sample(101.0, 1000, 0.8, 0.2, 0.1, 1.5, 2.3, 0.7),
           sample(102.0, 2000, 1.6, 0.4, 0.2, 2.0, 2.6, 0.9)]


def test_a_level_costs_the_counters_deltas_over_its_window():
    cost = level_cost(SAMPLES, 16, 100.5, 101.5)  # halfway between samples: linear
    assert cost.tokens == pytest.approx(1000) and cost.rounds == pytest.approx(1000)
    assert cost.forwards == pytest.approx(250)
    assert cost.busy_share == pytest.approx(0.8)
    assert cost.hop_cpu_s["orchestrator/orchestrator/rest"] == pytest.approx(0.2)
    assert cost.process_cpu_s == pytest.approx({"orchestrator": 0.5, "verifier": 0.3, "load generator": 0.2})
    assert cost.per_token_us(cost.process_cpu_s["orchestrator"]) == pytest.approx(500)
    assert cost.cores_busy == pytest.approx(1.0)
    table = markdown_table([cost], "simulated GPU")
    assert "| orchestrator/orchestrator/rest | 200 |" in table
    assert "| orchestrator/other (gRPC core, (de)serialization, GC) | 300 |" in table
    assert "| verifier busy share | 80% |" in table and "simulated GPU" in table
    assert level_costs(SAMPLES[:1], {16: (100.0, 101.0)}) == []  # one sample: no deltas


def test_counters_are_read_from_a_metrics_page_and_interpolated():
    page = ('# TYPE specpipe_cpu_seconds_total counter\n'
            'specpipe_cpu_seconds_total{role="verifier",hop="forward"} 1.5\n'
            '# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.0\n'
            '# TYPE specpipe_queue_depth gauge\nspecpipe_queue_depth{role="verifier"} 4.0\n')
    counters = parse_counters(page)
    assert counters[key(CPU_COUNTER, role="verifier", hop="forward")] == 1.5
    assert counters[key("process_cpu_seconds_total")] == 3.0
    assert not any(name == "specpipe_queue_depth" for name, _ in counters)  # gauges are not costs
    assert at(SAMPLES, 99.0, lambda s: s.t) == 100.0 and at(SAMPLES, 101.25, lambda s: s.t) == 101.25


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_hops_charge_the_threads_cpu_time_where_it_was_spent_and_nest():
    def value(role, hop):
        return metrics.CPU_SECONDS.labels(role=role, hop=hop)._value.get()

    before = {h: value("test", h) for h in ("outer", "inner", "lapped")}
    cpu.start_laps()
    spin(0.02)
    with cpu.hop("test", "inner"):
        spin(0.03)
    cpu.lap("test", "lapped")  # the 20 ms before the hop, not the hop's 30
    with cpu.hop("test", "outer"):
        spin(0.01)
        with cpu.hop("test", "inner"):
            spin(0.02)
    spent = {h: value("test", h) - before[h] for h in before}
    assert spent["lapped"] == pytest.approx(0.02, abs=0.006)
    assert spent["inner"] == pytest.approx(0.05, abs=0.006)
    assert spent["outer"] == pytest.approx(0.01, abs=0.006)
