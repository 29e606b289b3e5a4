"""`specpipe transcript record`: a preset's greedy decoding of the load test's prompts, recorded once
for the replayed verifier and drafter (`specpipe serve verifier|drafter --replay FILE`; docs/pipeline.md,
"Replay")."""

from __future__ import annotations

import argparse
import shlex
import sys

from specpipe.bench.loadtest import SUITES
from specpipe.cli import options
from specpipe.config.bench import SUITE_PROMPTS, LoadtestConfig


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "transcript", help="record a replay transcript of a model's greedy decoding",
        description="A transcript holds a verifier's greedy continuation of each prompt, the entropy at every "
                    "position, and the small model's likeliest tokens there. `specpipe serve verifier|drafter --replay "
                    "FILE` answer from it instead of running the models, so a load test can run the real models' "
                    "acceptance at another device's speed (--cost-model).",
    )
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    rec = actions.add_parser(
        "record", help="decode the load test's prompts and write the transcript",
        description="Decode the prompts of --suite (the first --prompt-limit of each suite, as `specpipe loadtest` "
                    "sends them) greedily with the preset's verifier, then run one teacher-forced forward of the "
                    "verifier over each for the entropies and one of the small model for its drafts; write a gzip "
                    "JSON transcript.",
    )
    rec.add_argument("--out", required=True, metavar="FILE", help="the transcript to write (.json.gz)")
    rec.add_argument("--suite", default=LoadtestConfig.suite, choices=SUITES,
                     help="the load test's prompts (mix: humaneval, mtbench and gsm8k) (default: %(default)s)")
    rec.add_argument(
        "--prompt-limit", type=int, default=SUITE_PROMPTS, help="prompts of each suite (default: %(default)s)"
    )
    rec.add_argument(
        "--max-new-tokens",
        type=int,
        default=256,
        help="continuation recorded per prompt; a load test may ask at most this many (default: %(default)s)",
    )
    rec.add_argument("--quiet", action="store_true", help="no progress bar")
    options.add_model_args(rec)
    rec.set_defaults(func=run_record)


def run_record(args: argparse.Namespace) -> int:
    from specpipe.bench import transcript
    from specpipe.config.services import generator_config
    from specpipe.core.transcript import save

    prompts = transcript.suite_prompts(args.suite, args.prompt_limit)
    source = "specpipe " + shlex.join(args.argv)
    recorded = transcript.record(generator_config(vars(args)), prompts, args.max_new_tokens, source,
                                 progress=not args.quiet)
    save(recorded.transcript, args.out)
    print(f"{args.out}: {len(recorded.transcript.entries)} prompts, {recorded.tokens} tokens; the teacher-forced "
          f"argmax differs at {recorded.disagreements} of them (near ties)", file=sys.stderr)
    return 0
