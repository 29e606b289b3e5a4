"""`specpipe bench`'s flags (specpipe.config.bench); what it runs: specpipe.bench.command."""

from __future__ import annotations

import argparse

from specpipe.cli import options

SUITES = ("humaneval", "mtbench", "gsm8k", "random", "noise", "recurring")


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="benchmark speculative decoding against the verifier alone",
        description="Run verifier-only transformers greedy generate() and speculative decoding on the same "
        "prompts in one run; report tokens/s, speed-up, tokens per verify call, and whether every output "
        "is identical to the baseline. Pinned to one CPU core per service that runs at once (the default); "
        "embedded, the verifier and the drafter share the process's cores (specpipe.engine.cores).",
    )
    parser.add_argument("--suite", choices=SUITES, default="humaneval",
                        help="prompt suite; random: made-up words to continue (the models copy them, so drafts "
                        "are good); noise: random base64, random passwords and poems of random words in mixed "
                        "scripts (poor drafts with --preset smollm2; qwen-coder copies and repeats, so its drafts "
                        "still land); recurring: requests from HumanEval, MT-Bench and GSM8K that recur, in order "
                        "(30%% repeat an earlier request, 40%% an earlier one's template with other numbers, names or "
                        "identifiers, 30%% unique), each drafting method run with its store learning finished outputs "
                        "and not, beside the verifier alone, reported by kind (default: %(default)s)")
    parser.add_argument("--prompts", default=None, metavar="FILE.jsonl",
                        help="your own prompts instead of --suite: one JSON object a line, {\"prompt\": ...} or "
                        "{\"messages\": [{\"role\", \"content\"}, ...]}, optional \"id\"")
    parser.add_argument("--limit", type=int, default=10,
                        help="prompts from the suite; MT-Bench takes its categories in turn; recurring: requests in "
                        "the sequence (default: %(default)s)")
    parser.add_argument("--turns", type=int, choices=(1, 2), default=1,
                        help="2: also the second turn of each MT-Bench prompt, asked after the verifier's own "
                        "greedy answer to the first (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="(default: %(default)s)")
    parser.add_argument("--json", dest="json_file", default=None, metavar="FILE", help="write the results as JSON")
    parser.add_argument("--drafters", default=None, metavar="LIST",
                        help="comma-separated drafters to compare in this run, e.g. model,ngram,hybrid, each with "
                        "--schedule / --predictor (default: the one --drafter names)")
    parser.add_argument("--methods", default=None, metavar="LIST",
                        help="comma-separated methods, each DRAFTER[:SCHEDULE[:PREDICTOR]][/K][+adaptive][+learn|"
                        "+no-learn][@HOP_MS] (K: draft length, or with +adaptive its cap; +learn / +no-learn: the "
                        "method's n-gram store learns each finished output or not; default: the orchestrator's "
                        "default, and with --suite recurring both), e.g. model:sequential,model:branch,"
                        "model:branch:paper,hybrid:branch/8+adaptive,model:branch@2 (@HOP_MS needs --transport "
                        "grpc); overrides --drafters")
    parser.add_argument("--transport", choices=("embedded", "grpc"), default="embedded",
                        help="embedded: everything in this process; grpc: the verifier and the drafter as "
                        "`specpipe serve` processes on loopback, each pinned to its own core (default: %(default)s)")
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="do not pin to one CPU core per service (pinned by default)")
    parser.add_argument("--baselines", default="generate,generate-threads", metavar="LIST",
                        help="transformers runs beside specpipe's, on the same prompts: generate (the verifier "
                        "alone, eager, one thread: always run, the speed-up column is over it); on specpipe's weights "
                        "path (packed when it is) with a thread per core the pipeline uses: generate-threads (the "
                        "verifier alone), assisted (assisted generation with the same drafter), prompt-lookup "
                        "(at each --prompt-lookup-tokens) (default: %(default)s)")
    parser.add_argument("--prompt-lookup-tokens", type=_token_counts, default=(4, 10), metavar="N,N,...",
                        help="prompt lookup's prompt_lookup_num_tokens settings, one run each; the report takes "
                        "the best (default: 4,10)")
    parser.add_argument("--sweep", default=None, metavar="K,K,...",
                        help="run every method that does not name its /K or +adaptive at each fixed draft length K "
                        "and adaptive (at most the largest K), and report the best fixed setting against adaptive")
    report = parser.add_argument_group("report")
    report.add_argument("--report", nargs="+", default=None, metavar="FILE.json",
                        help="instead of benchmarking: the results section (summary over suites, a table per "
                        "suite, plots) from bench JSON files")
    report.add_argument("--readme", default=None, metavar="README.md",
                        help="with --report: replace the README's section between <!-- bench-report:begin --> and "
                        "<!-- bench-report:end --> (default: print it)")
    report.add_argument("--section", default=None, metavar="NAME",
                        help="with --readme: the section between <!-- bench-report:NAME:begin --> and "
                        "<!-- bench-report:NAME:end --> instead")
    report.add_argument("--plot-dir", default="bench-results/plots", metavar="DIR",
                        help="with --report: where the PNG plots go (default: %(default)s)")
    curve = parser.add_argument_group("forward curve")
    curve.add_argument("--forward-curve", action="store_true",
                       help="instead of decoding prompts: measure T(k), one forward of k new tokens after a "
                       "300-token context, for the verifier and the drafter, eager and (with --compile on) "
                       "compiled, and the speed-up bounds it implies")
    curve.add_argument("--acceptance", default="0.99,0.72,0.42", metavar="LIST",
                       help="per-token acceptance rates to compute bounds for (default: the model drafter's "
                       "measured HumanEval, GSM8K and MT-Bench rates, %(default)s)")
    curve.add_argument("--plot", default=None, metavar="PNG", help="write the curves as a PNG plot")
    options.add_model_args(parser)
    options.add_speculation_args(parser, in_process=True)
    options.add_hop_delay_arg(parser)
    # A thread per core the process may use (after pinning); a method is adaptive unless it names a
    # fixed /K (or --adaptive off).
    parser.set_defaults(func=run, threads=0)


def _token_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected counts >= 1, e.g. 4,10; got {text!r}")
    return counts


def run(args: argparse.Namespace) -> int:
    from specpipe.bench.command import bench
    from specpipe.config.bench import bench_config

    return bench(bench_config(vars(args)))
