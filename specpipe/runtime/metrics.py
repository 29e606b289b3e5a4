"""Prometheus metrics: counters and histograms (ratios are computed where they are read), and gauges
for the parameters adaptive control has fitted.

Every process that serves one or more roles exports the default registry over HTTP
(`specpipe serve` / `specpipe up`, flag --metrics-port)."""

from prometheus_client import Counter, Gauge, Histogram

_MS_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)

ROUNDS = Counter("specpipe_rounds_total", "Verify rounds run by the orchestrator", ["drafter"])
DRAFTED_TOKENS = Counter("specpipe_drafted_tokens_total", "Draft nodes sent to the verifier", ["drafter"])
ACCEPTED_TOKENS = Counter("specpipe_accepted_tokens_total", "Draft tokens accepted by the verifier", ["drafter"])
EMITTED_TOKENS = Counter("specpipe_emitted_tokens_total", "Verified tokens emitted to clients", ["drafter"])
DRAFT_FAILURES = Counter(
    "specpipe_draft_failures_total", "Rounds that went on without a draft because the drafter failed", ["drafter"]
)
SOURCE_DRAFTED = Counter(
    "specpipe_drafted_tokens_by_source_total",
    "Draft nodes sent to the verifier, by source "
    "(model, or the n-gram drafter's context / verifier table / learned store (global))",
    ["drafter", "source"],
)
SOURCE_ACCEPTED = Counter(
    "specpipe_accepted_tokens_by_source_total", "Draft tokens accepted, by source", ["drafter", "source"]
)
STALE_PROPOSALS = Counter("specpipe_stale_proposals_total", "Proposals aborted by the drafter because a newer epoch "
                          "of their session had arrived (dropped branch-prediction hypotheses)")
HYPOTHESES = Counter("specpipe_hypotheses_total", "Branch-prediction hypotheses issued (pre-drafts requested)",
                     ["drafter", "predictor"])
PREDICTION_HITS = Counter(
    "specpipe_prediction_hits_total", "Rounds whose outcome matched a hypothesis", ["drafter", "predictor"]
)
PREDICTION_MISSES = Counter("specpipe_prediction_misses_total", "Rounds with hypotheses whose outcome matched none",
                            ["drafter", "predictor"])
WASTED_DRAFT_TOKENS = Counter(
    "specpipe_wasted_draft_tokens_total", "Pre-drafted tokens dropped (rollback)", ["drafter"]
)
TRIMMED_DRAFT_TOKENS = Counter(
    "specpipe_trimmed_draft_tokens_total",
    "Drafted tokens not verified: adaptive control cut nodes whose expected acceptance did not pay for them",
    ["drafter"],
)
HIDDEN_DRAFT_MS = Counter(
    "specpipe_hidden_draft_ms_total", "Draft time that ran while the verifier was busy", ["drafter"]
)
DRAFT_TIME_MS = Counter("specpipe_draft_time_ms_total", "Draft time of the drafts sent to the verifier", ["drafter"])
VERIFIER_IDLE_MS = Counter("specpipe_verifier_idle_ms_total", "Time a session's verifier waited between rounds "
                           "(from a verify reply to the next verify call)", ["drafter", "schedule"])
GENERATIONS = Counter("specpipe_generations_total", "Finished generations", ["finish_reason"])

VERIFY_MS = Histogram(
    "specpipe_verify_forward_ms", "Verifier forward time per round", ["draft_nodes"], buckets=_MS_BUCKETS
)
PREFILL_MS = Histogram("specpipe_prefill_ms", "Verifier prefill time", buckets=_MS_BUCKETS)
DRAFT_MS = Histogram("specpipe_draft_ms", "Drafter time per proposal", ["drafter"], buckets=_MS_BUCKETS)
ADAPTIVE_DRAFT_LEN = Histogram("specpipe_adaptive_draft_len", "Main-chain draft length per round chosen by adaptive "
                               "control (0 = plain decoding)", ["drafter"], buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16))
SPECULATION_GATE = Gauge("specpipe_speculation_gate", "1 while the orchestrator's generations of a drafter kind may "
                         "draft, 0 while its speculation gate runs them plain (orchestrator/gate.py)", ["drafter"])
VERIFY_COST_MS = Gauge(
    "specpipe_verify_cost_ms",
    "Verify time fitted by adaptive control, T(n) = fixed + per_token * n for n tokens fed",
    ["term"],
)
ROUND_MS = Histogram(
    "specpipe_round_ms", "Orchestrator round time (draft + verify + transport)", ["drafter"], buckets=_MS_BUCKETS
)
ROUND_PART_MS = Counter("specpipe_round_part_ms_total", "Where generations' wall time went, as the orchestrator saw "
                        "it (ms): prefill, wait (for drafts), control, call (the verify call), emit, record, rest; "
                        "forward: the verifier's forward within call", ["drafter", "part"])

NGRAM_LOOKUPS = Counter("specpipe_ngram_lookups_total", "N-gram store lookups by the n-gram drafter")
NGRAM_DRAFT_TOKENS = Counter(
    "specpipe_ngram_draft_tokens_total",
    "N-gram draft tokens, by the n of the matching n-gram (long: a learned match longer than N-1 tokens)",
    ["level"],
)
CACHE_FAILURES = Counter(
    "specpipe_cache_failures_total", "N-gram store calls that failed (generation went on without them)", ["call"]
)
CACHE_CALLS = ("lookup", "record_branches", "update_global", "release")  # CACHE_FAILURES' calls
# The learned store per tenant: the label is a hash of the tenant's id, never the id (core.tenancy.tenant_label)
LEARNED_LOOKUPS = Counter("specpipe_learned_lookups_total", "N-gram drafter lookups of the shared store, by tenant",
                          ["tenant"])
LEARNED_HITS = Counter("specpipe_learned_hits_total", "Lookups whose draft came from the tenant's learned store "
                       "(its finished outputs and seeded corpora)", ["tenant"])
LEARNED_STORE_TOKENS = Gauge("specpipe_learned_store_tokens", "Tokens in a tenant's learned store, as the process that "
                             "last fed it saw (max over processes: its size)", ["tenant"])

VERIFY_BATCH_SESSIONS = Histogram("specpipe_verify_batch_sessions", "Sessions per batched verifier forward",
                                  buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64))
VERIFY_BATCH_TOKENS = Histogram("specpipe_verify_batch_tokens", "Tokens per batched verifier forward (all sessions)",
                                buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048))
DRAFT_BATCH_SESSIONS = Histogram("specpipe_draft_batch_sessions", "Proposals per batched drafter forward (each of a "
                                 "session's concurrent branch-schedule proposals counts once)",
                                 buckets=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64))
DRAFT_BATCH_TOKENS = Histogram("specpipe_draft_batch_tokens", "Tokens per batched drafter forward (all proposals)",
                               buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048))
QUEUE_DEPTH = Gauge(
    "specpipe_queue_depth",
    "Requests waiting: verifier rounds and prefills and drafter proposals for the model, "
    "orchestrator generations for a session slot",
    ["role"],
)
VERIFY_TURNAROUND_MS = Histogram("specpipe_verify_turnaround_ms", "Verifier: time from the end of a decoding "
                                 "session's forward to its next round's arrival (the orchestrator's turn: reply, "
                                 "drafting, next request)", buckets=_MS_BUCKETS)
QUEUE_WAIT_MS = Histogram("specpipe_queue_wait_ms", "Time a request waited before its work started", ["role"],
                          buckets=_MS_BUCKETS)
TTFT_MS = Histogram("specpipe_ttft_ms", "Orchestrator: time from a Generate request to its first chunk of tokens",
                    buckets=_MS_BUCKETS)
INTER_TOKEN_MS = Histogram("specpipe_inter_token_ms", "Orchestrator: time between streamed tokens (a chunk of n "
                           "tokens counts its gap n times, each gap / n)", buckets=_MS_BUCKETS)
# Replicas and serving (specpipe.serving.failover, specpipe.serving.server): the autoscalers' signals.
VERIFIER_FAILOVERS = Counter("specpipe_verifier_failovers_total", "Sessions re-prefilled on another verifier replica "
                             "(theirs died, drained or lost the session)", ["reason"])
DRAFTER_FAILOVERS = Counter("specpipe_drafter_failovers_total", "Proposals retried on another drafter replica")
RPC_INFLIGHT = Gauge("specpipe_rpc_inflight", "RPCs being served now (a Generate stream counts for its lifetime)",
                     ["method"])
RPC_SECONDS = Counter("specpipe_rpc_seconds_total", "Time spent serving RPCs; its rate is the busy ratio "
                      "(1.0 = one call always running)", ["method"])
DRAINING = Gauge("specpipe_draining", "1 while the server drains (SIGTERM): health NOT_SERVING, no new sessions")
REPLICAS = Gauge("specpipe_replicas", "Replicas of a role an orchestrator routes over, by state: serving, failed (no "
                 "new work until a probe says SERVING), gone (left the DNS answer)", ["role", "state"])
REPLICA_STATES = ("serving", "failed", "gone")
REPLICA_FAILURES = Counter("specpipe_replica_failures_total", "Times a replica was marked failed by a call or a probe "
                           "(it gets no new work until a probe says SERVING)", ["role"])
ADMISSION_REJECTIONS = Counter(
    "specpipe_admission_rejections_total", "Requests refused before any work, by the role that refused them and why: "
    "full (every generation slot and queue place taken), deadline (no slot freed within the client's deadline), "
    "sessions (the verifier's max sessions), queue (the model's queue)", ["role", "reason"])
TTFT_SLO_MS = Gauge("specpipe_ttft_slo_ms", "The orchestrator's time-to-first-token objective (--ttft-slo-ms): what "
                    "the dashboard draws and the TTFT alert compares the p99 with")


def zero(counter: Counter, *label_sets: dict[str, str]) -> None:
    """Export these children of counter at 0 from the start, so a rate or an increase sees their first event
    (an alert on a child that appears with its first count would miss it)."""
    for labels in label_sets:
        counter.labels(**labels)
HTTP_REFUSED = Counter("specpipe_http_refused_total", "HTTP connections and requests the server refused before the "
                       "application read them: beyond --http-max-connections, headers or body too slow", ["reason"])

# The pipeline's own cost (docs/pipeline.md): busy share and CPU time by hop, and the simulated clock.
FORWARD_SECONDS = Counter("specpipe_forward_seconds_total", "Wall time of a role's model forwards (simulated ones at "
                          "the cost model's time); its rate is the busy share", ["role"])
FORWARDS = Counter(
    "specpipe_forwards_total", "A role's model forwards (batched: one per forward, whatever its sessions)", ["role"]
)
CPU_SECONDS = Counter("specpipe_cpu_seconds_total", "CPU time of the threads of a role, by hop (specpipe.runtime.cpu); "
                      "the process's whole CPU time is process_cpu_seconds_total", ["role", "hop"])
SIMULATED_FORWARDS = Counter(
    "specpipe_simulated_forwards_total", "Forwards held to a cost model's curve (--cost-model)", ["role"]
)
SIMULATED_OVERRUNS = Counter("specpipe_simulated_overruns_total", "Simulated forwards whose real compute took longer "
                             "than the cost model allows (their real time is kept)", ["role"])
SIMULATED_OVERRUN_MS = Counter("specpipe_simulated_overrun_ms_total", "Time by which real forwards overran the cost "
                               "model", ["role"])
SIMULATED_REAL_MS = Counter("specpipe_simulated_real_ms_total", "Real compute time of the simulated forwards", ["role"])
