"""Flags shared by several commands. Their names are the keys of specpipe.config.services' builders,
and their defaults the configs' (and the SPECPIPE_* environment's, specpipe.config.env)."""

from __future__ import annotations

import argparse

from specpipe.cli.models_cmd import add_prepare_arg
from specpipe.config.env import environment
from specpipe.config.presets import DEFAULT_PRESET, PRESETS
from specpipe.config.services import COMPILE, DRAFT_WEIGHTS, DTYPES, VERIFIER_WEIGHTS, BatchConfig, ModelConfig
from specpipe.core.types import (
    ADAPTIVE,
    ALL_HYPOTHESES,
    DRAFTER_KINDS,
    DRAFTER_WITH_MODEL,
    FREE_DRAFT_FACTOR,
    PREDICTORS,
    SCHEDULES,
    SamplingParams,
    SpeculationOptions,
)

DEFAULT = SpeculationOptions()  # the product's defaults, defined once (specpipe.core.types)
MODEL = ModelConfig()
BATCH = BatchConfig()


def add_model_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("models")
    group.add_argument("--preset", default=environment().preset or DEFAULT_PRESET, choices=sorted(PRESETS),
                       help="model pair (default: %(default)s; env SPECPIPE_PRESET)")
    group.add_argument("--verifier", default=None, help="local model folder, or a model id in the local Hugging Face cache, of the verifier (overrides the preset)")
    group.add_argument("--draft-model", default=None, help="local model folder, or a model id in the local Hugging Face cache, of the drafter (overrides the preset)")
    group.add_argument("--device", default=MODEL.device, help="torch device, e.g. cpu, cuda, cuda:1 (default: %(default)s)")
    add_dtype_arg(group)
    group.add_argument("--threads", type=int, default=MODEL.threads, help="torch threads per process (default: all cores)")
    add_compile_arg(group)
    add_prepare_arg(group)


def add_dtype_arg(parser) -> None:
    parser.add_argument("--dtype", default=MODEL.dtype, choices=DTYPES,
                        help="the models' weights and activations; auto: bfloat16 on a GPU, float32 on a CPU (where "
                        "bf16 is no faster) (default: %(default)s)")


def add_compile_arg(parser) -> None:
    parser.add_argument("--compile", default=MODEL.compile, choices=COMPILE,
                        help="fast forward passes, chosen by --device. CPU: every linear layer runs a small-M GEMM "
                        "kernel built for this CPU with the C compiler (once, cached) over weights packed at load; "
                        "CUDA: CUDA graphs over bucketed shapes (batched and one-session forwards), captured at "
                        "start-up (seconds). auto: the CPU kernel when a C compiler is there, else eager; the "
                        "graphs on CUDA; on: always (an error without a compiler); off: eager (default: %(default)s)")
    parser.add_argument("--draft-weights", default=MODEL.draft_weights, choices=DRAFT_WEIGHTS,
                        help="the weights of the drafter's packed linear layers (CPU kernel only): bf16 streams "
                        "half the bytes per token, int8 (a scale per output feature) a quarter, with fp32 arithmetic; "
                        "they change what the drafter proposes, never what is emitted (the verifier's weights are "
                        "--verifier-weights). auto: int8 when the CPU kernel runs, else fp32 (default: %(default)s)")
    parser.add_argument("--verifier-weights", default=MODEL.verifier_weights, choices=VERIFIER_WEIGHTS,
                        help="the weights of the verifier's packed linear layers (CPU kernel only): bf16 streams "
                        "half the bytes per token, with fp32 arithmetic, and changes the model: the output is then "
                        "that bf16 verifier's own greedy decoding (lossless against it, not against fp32) "
                        "(default: %(default)s)")
    parser.add_argument("--batching", default="on", choices=("on", "off"),
                        help="on: the verifier (and the model drafter) run the work of all their sessions as one "
                        "forward (docs/batching.md); off: one session per forward, as before batching (to compare) "
                        "(default: %(default)s)")


def add_speculation_args(parser: argparse.ArgumentParser, drafter: str | None = None, in_process: bool = False) -> None:
    """drafter: the --drafter default; None: resolved by specpipe.config.services.speculation, from
    --drafter-addr, or in_process (the command drafts in its own process) from the models."""
    group = parser.add_argument_group("speculation")
    own = [name for name, p in PRESETS.items() if p.drafter_layers is None]
    default = drafter or (f"{DRAFTER_WITH_MODEL} where the preset's drafter is a separate small model ({', '.join(own)}, "
                          f"or --draft-model), else {DEFAULT.drafter}" if in_process else
                          f"{DRAFTER_WITH_MODEL} with --drafter-addr, else {DEFAULT.drafter}")
    group.add_argument("--drafter", default=drafter, choices=DRAFTER_KINDS,
                       help="draft source: the small model, the n-gram store, both merged into one tree (the "
                       "n-gram lookup first, the small model where it does not suffice), or none (the verifier "
                       f"alone) (default: {default})")
    group.add_argument("--cache", default=environment().cache or "memory", metavar="URL",
                       help="n-gram store: memory (this process), redis (`specpipe up` only: starts a local "
                       "redis-server), redis://[:password@]host:port/db, rediss://... (TLS) or grpc://host:port "
                       "(a cache service); all but memory are shared by every replica (default: %(default)s; "
                       "env SPECPIPE_CACHE)")
    group.add_argument("--draft-len", type=int, default=None, metavar="K",
                       help=f"draft depth per round; with adaptive control its cap ({FREE_DRAFT_FACTOR}x that for "
                       "the n-gram drafter, whose drafts cost nothing: the evidence decides what is verified). Given "
                       f"without --adaptive it fixes the draft depth (adaptive off) (default: {DEFAULT.draft_len}, adaptive)")
    group.add_argument("--width", type=int, default=DEFAULT.width,
                       help="tree width at the first draft levels; 1 = chain. With adaptive control the widest "
                       "tree: each round keeps only the alternatives whose expected acceptance pays for verifying "
                       "them (default: %(default)s)")
    group.add_argument("--schedule", default=DEFAULT.schedule, choices=SCHEDULES,
                       help="sequential: draft, then verify; branch: while the verifier checks a round, draft the "
                       "next one for its predicted outcomes, roll back on a miss (default: %(default)s)")
    group.add_argument("--predictor", default=DEFAULT.predictor, choices=PREDICTORS,
                       help="branch schedule: calibrated (drafter confidence, calibrated online) or paper (the "
                       "fitted prediction function of Duan et al. 2024, eq. 12) (default: %(default)s)")
    group.add_argument("--hypotheses", type=hypotheses_arg, default=DEFAULT.hypotheses, metavar="M",
                       help="branch schedule: outcomes pre-drafted per round, most likely first; all = every "
                       "outcome of the main chain (default: %(default)s)")
    group.add_argument("--adaptive", default=None, choices=ADAPTIVE,
                       help="on: choose each round's draft length (at most --draft-len, 0 = plain decoding), "
                       "pre-drafts (at most --hypotheses) and the draft nodes verified (the tree budget) for the "
                       "most expected tokens per second, from the measured verify and draft times, the acceptance "
                       "per depth, draft source and rank, and the verifier's entropy; "
                       "greedy output is unchanged, a sampled one keeps its distribution but no longer "
                       "repeats from the seed alone; off: a fixed --draft-len (default: on, unless --draft-len "
                       "is given)")


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("sampling (temperature 0 = greedy, identical to the verifier's own greedy output)")
    group.add_argument("--temperature", type=float, default=0.0, help="(default: %(default)s)")
    group.add_argument("--top-p", type=float, default=1.0, help="(default: %(default)s)")
    group.add_argument("--top-k", type=int, default=0, help="0 = off (default: %(default)s)")
    group.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")


def hypotheses_arg(value: str) -> int:
    if value == "all":
        return ALL_HYPOTHESES
    try:
        m = int(value)
    except ValueError:
        m = 0
    if m < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1 or 'all', got {value!r}")
    return m


def speculation_flags(spec: SpeculationOptions) -> tuple[str, ...]:
    """The flags of spec, to pass on to another specpipe command."""
    hypotheses = "all" if spec.hypotheses == ALL_HYPOTHESES else str(spec.hypotheses)
    return ("--drafter", spec.drafter, "--draft-len", str(spec.draft_len), "--width", str(spec.width),
            "--schedule", spec.schedule, "--predictor", spec.predictor, "--hypotheses", hypotheses,
            "--adaptive", spec.adaptive)


def add_hop_delay_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--hop-delay-ms", type=float, default=0.0, metavar="MS",
                        help="add MS of latency to each direction of every gRPC call to the verifier and drafter, "
                        "to measure how well a schedule hides network latency on loopback (default: off)")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed)


HEALTH_THREADS = 4  # server threads kept free of admitted work: health and reflection never wait


def add_admission_args(parser: argparse.ArgumentParser, role: str) -> None:
    """--max-sessions / --max-queue (verifier and orchestrator); the verifier's batching flags."""
    group = parser.add_argument_group("admission" if role == "orchestrator" else "admission and batching")
    group.add_argument("--max-sessions", type=int, default=64,
                       help="sessions open at once (orchestrator: generations running); beyond: RESOURCE_EXHAUSTED "
                       "before any work (default: %(default)s)")
    group.add_argument("--max-queue", type=int, default=64,
                       help="requests waiting for the model (orchestrator: generations waiting for a slot); beyond: "
                       "RESOURCE_EXHAUSTED (default: %(default)s)")
    if role == "verifier":
        group.add_argument("--max-batch-tokens", type=int, default=BATCH.max_batch_tokens,
                           help="tokens per batched verifier forward, all sessions together (default: %(default)s)")
        group.add_argument("--prefill-chunk", type=int, default=BATCH.prefill_chunk,
                           help="prompt tokens a prefill feeds per forward, so a long prompt never stalls other "
                           "sessions' rounds for more than one chunk (default: %(default)s)")
        group.add_argument("--prefill-stall", type=float, default=BATCH.prefill_stall, metavar="X",
                           help="while other sessions decode, prompt chunks are cut so a forward takes at most X "
                           "times as long as their rounds alone (steered by the measured forward times), keeping their "
                           "inter-token latency while a long prompt is admitted; a higher X admits the prompt "
                           "sooner; 0 = chunks of --prefill-chunk (default: %(default)s)")
        group.add_argument("--gather-grace", type=float, default=BATCH.gather_grace, metavar="SHARE",
                           help="while sessions decode, a forward first waits up to this share of its predicted "
                           "time (2-50 ms) for their rounds that are not in yet and are due back (their round "
                           "ended within the longest of recent turnarounds), so they share one forward "
                           "instead of splitting into groups that each pay one; a lone session never waits; 0 = "
                           "dispatch at once (default: %(default)s)")


def worker_threads(args: argparse.Namespace) -> int:
    """gRPC server threads: every admitted or queued request holds one, plus HEALTH_THREADS to spare."""
    admitted = getattr(args, "max_queue", 0) + (args.max_sessions if args.role == "orchestrator" else 0)
    return max(args.max_workers, admitted + HEALTH_THREADS)
