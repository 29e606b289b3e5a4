"""`specpipe generate`: one generation on the embedded default (or a running orchestrator with --addr)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from specpipe.cli import options, security_args
from specpipe.core.types import RoundStats


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate text with speculative decoding",
        description="Generate text. Every emitted token is verified: with temperature 0 the output equals "
        "the verifier's own greedy decoding token for token.",
    )
    parser.add_argument("--prompt", required=True, help="the user prompt (the model's chat template is applied)")
    parser.add_argument("--raw", action="store_true", help="send the prompt as raw text, without the chat template")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="(default: %(default)s)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--json", action="store_true", help="print one JSON object: text, token_ids, stats")
    parser.add_argument("--addr", default=None, help="host:port of a running orchestrator (default: run embedded)")
    parser.add_argument("--tenant", default="", metavar="ID",
                        help="the tenant the generation belongs to (its n-gram tables; docs/security.md) "
                        "(default: the default tenant)")
    security_args.add_client_tls_args(parser, " of --addr")
    options.add_model_args(parser)
    options.add_speculation_args(parser, in_process=True)
    options.add_sampling_args(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from specpipe.config.services import generator_config, speculation
    from specpipe.core.types import GenerationRequest

    messages = None if args.raw else [("user", args.prompt)]
    prompt = args.prompt if args.raw else None
    if args.addr:
        from specpipe.serving.clients import GenerationClient

        tls, token = security_args.client_security(args)
        client = GenerationClient(args.addr, tls=tls, auth_token=token)
        spec = speculation(vars(args))
        if args.drafter is None:  # the server's default drafter (empty fields take the server's defaults)
            spec = dataclasses.replace(spec, drafter="")
        chunks = client.generate(
            prompt=prompt, messages=messages, max_new_tokens=args.max_new_tokens, stop=tuple(args.stop),
            sampling=options.sampling_params(args), speculation=spec, tenant=args.tenant,
        )
    else:
        from specpipe.app import startup

        config = generator_config(vars(args))
        with startup.step(startup.IMPORTS):
            from specpipe.app.wiring import embedded_generator
        generator = embedded_generator(config)
        request = GenerationRequest(
            prompt_ids=generator.encode(prompt=prompt, messages=messages),
            max_new_tokens=args.max_new_tokens,
            stop=tuple(args.stop),
            sampling=options.sampling_params(args),
            speculation=config.speculation,
            tenant=args.tenant,
        )
        chunks = generator.generate(request)

    start = time.perf_counter()
    text: list[str] = []
    token_ids: list[int] = []
    rounds: list[RoundStats] = []
    for chunk in chunks:
        text.append(chunk.text)
        token_ids.extend(chunk.token_ids)
        if chunk.round is not None:
            rounds.append(chunk.round)
        if not args.json:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
        finish = chunk.finish_reason
    elapsed = time.perf_counter() - start
    if args.json:
        print(json.dumps({"text": "".join(text), "token_ids": token_ids, "finish_reason": finish,
                          "stats": generation_stats(rounds, len(token_ids), elapsed)}))
    else:
        print()
    return 0


def generation_stats(rounds: Sequence[RoundStats], num_tokens: int, elapsed_s: float) -> dict[str, Any]:
    """Per-generation summary; tokens_per_round is DE (tokens per verifier forward)."""
    drafted = sum(r.drafted for r in rounds)
    accepted = sum(r.accepted for r in rounds)
    predicted = sum(r.hypotheses > 0 for r in rounds)
    return {
        "rounds": len(rounds),
        "drafted": drafted,
        "accepted": accepted,
        "tokens": num_tokens,
        "tokens_per_round": num_tokens / len(rounds) if rounds else 0.0,
        "tokens_per_s": num_tokens / elapsed_s if elapsed_s > 0 else 0.0,
        "draft_ms": sum(r.draft_ms for r in rounds),
        "verify_ms": sum(r.verify_ms for r in rounds),
        "hit_rate": sum(r.hit for r in rounds) / predicted if predicted else None,  # branch schedule
        "hidden_draft_ms": sum(r.hidden_ms for r in rounds),
        "verifier_idle_ms": sum(r.idle_ms for r in rounds),
    }
