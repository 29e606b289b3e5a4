"""Locust load test of specpipe's public APIs: the streaming Generate RPC of an orchestrator, or
(--api openai) its OpenAI-compatible /v1/chat/completions with server-sent events.

    locust -f deploy/locust/locustfile.py --headless --host 127.0.0.1:50051 -u 4 -r 4 -t 60s \
        --csv out/locust --html out/locust.html --records out/requests.jsonl
    locust -f deploy/locust/locustfile.py --headless --host http://127.0.0.1:8000 --api openai ...

Each generation fires one Locust request event per measure: `ttft` (call -> first chunk), `itl` (one per token
of every later chunk: the chunk's gap split over its tokens) and `e2e` (the whole stream; its response length
is the tokens received). A failed call is one `e2e` failure named by its gRPC status (HTTP: HTTP_<code>). With
--records every call also becomes a JSON line (specpipe.bench.loadstats), from which `specpipe loadtest`
computes tokens/s, percentiles and goodput per user level. Add shapes.py for the load shapes:
`-f deploy/locust/locustfile.py,deploy/locust/shapes.py --shape steps`."""

from __future__ import annotations

import grpc.experimental.gevent as grpc_gevent

grpc_gevent.init_gevent()  # locust patched the stdlib when it loaded; grpc must be patched before any channel

import itertools
import json
import os
import random
import time
from collections import Counter
from dataclasses import dataclass

import gevent
from locust import User, constant, events, task
from locust.stats import CSV_STATS_INTERVAL_SEC

from specpipe.bench.loadstats import OK, RequestRecord, itl_per_token, record_line, round_parts
from specpipe.bench.prompts import Prompt, load_suite
from specpipe.config.bench import SUITE_PROMPTS, LoadtestConfig
from specpipe.config.env import environment
from specpipe.core import types
from specpipe.core.errors import SpecpipeError, Unavailable
from specpipe.serving.clients import GenerationClient
from specpipe.serving.security import Tls, read_token

MIX = ("humaneval", "mtbench", "gsm8k")  # code, chat, math
ITL_EVENTS = ("token", "chunk", "off")
LOAD = LoadtestConfig()  # `specpipe loadtest`'s defaults (it passes every flag; these serve `locust -f` alone)


@events.init_command_line_parser.add_listener
def _add_options(parser) -> None:
    parser.add_argument("--api", default=LOAD.api, choices=("grpc", "openai"),
                        help="grpc: the Generate RPC at host:port; openai: /v1/chat/completions at --host's URL "
                        "(default: %(default)s)")
    parser.add_argument("--suite", default=LOAD.suite, help="prompts: humaneval, mtbench, gsm8k, random, noise or mix "
                        "(code, chat and math in turn) (default: %(default)s)")
    parser.add_argument(
        "--prompt-limit", type=int, default=SUITE_PROMPTS, help="prompts taken from each suite (default: %(default)s)"
    )
    parser.add_argument("--max-new-tokens", type=int, default=environment().max_new_tokens or LOAD.max_new_tokens,
                        help="tokens per generation (default: %(default)s; env SPECPIPE_MAX_NEW_TOKENS)")
    parser.add_argument("--deadline-s", type=float, default=LOAD.deadline_s,
                        help="client deadline of every call (default: %(default)s)")
    parser.add_argument("--temperature", type=float, default=LOAD.temperature, help="0 = greedy (default: %(default)s)")
    parser.add_argument("--top-p", type=float, default=LOAD.top_p)
    parser.add_argument(
        "--seed", type=int, default=LOAD.seed, help="prompt order and sampling seeds (default: %(default)s)"
    )
    # Speculation, per request: empty / 0 = the server's default
    parser.add_argument("--drafter", default="", help="model, ngram, hybrid or none (speculation off)")
    parser.add_argument("--draft-len", type=int, default=0)
    parser.add_argument("--width", type=int, default=0)
    parser.add_argument("--schedule", default="", help="sequential or branch")
    parser.add_argument("--adaptive", default="", help="on or off")
    parser.add_argument("--records", default="", help="append one JSON line per call to this file")
    parser.add_argument("--load-processes", type=int, default=1,
                        help="with Locust's --processes N: N, so each worker records the whole load's user count "
                        "(its own share times N; every count a multiple of N) (default: %(default)s)")
    parser.add_argument("--itl-events", default="token", choices=ITL_EVENTS,
                        help="Locust's itl entries: token (one event per token), chunk (one per chunk, its "
                        "per-token gap, length its tokens: far less of the load generator's CPU at thousands of "
                        "tokens a second) or off; the --records are the same either way (default: %(default)s)")
    # Transport security of the calls (docs/security.md); --grpc-: Locust's own --tls-* serve its web UI
    parser.add_argument("--grpc-tls-ca", default="", help="TLS, trusting this CA (default: plaintext)")
    parser.add_argument("--grpc-tls-cert", default="", help="client certificate (mutual TLS)")
    parser.add_argument("--grpc-tls-key", default="", help="the key of --grpc-tls-cert")
    parser.add_argument("--grpc-auth-token-file", default="", help="send this file's bearer token")


@dataclass(frozen=True)
class Workload:
    prompts: tuple[Prompt, ...]
    max_new_tokens: int
    deadline_s: float
    temperature: float
    top_p: float
    speculation: types.SpeculationOptions | None  # None = the server's defaults
    itl_events: str = "token"  # ITL_EVENTS


def workload(options) -> Workload:
    suites = MIX if options.suite == "mix" else (options.suite,)
    loaded = [load_suite(name, limit=options.prompt_limit) for name in suites]
    prompts = [p for group in loaded for p in group]
    random.Random(options.seed).shuffle(prompts)  # one fixed order for every run with this seed
    given = {"drafter": options.drafter, "draft_len": options.draft_len, "width": options.width,
             "schedule": options.schedule, "adaptive": options.adaptive}
    # Fields left empty / 0 on the wire take the server's defaults (convert.speculation_from_proto).
    speculation = types.SpeculationOptions(**given, predictor="", hypotheses=0) if any(given.values()) else None
    return Workload(tuple(prompts), options.max_new_tokens, options.deadline_s, options.temperature, options.top_p,
                    speculation, options.itl_events)


class RecordLog:
    """The --records file: one JSON line per call, appended in one write (gevent runs one greenlet at a time, and
    the workers of --processes append to the same file: a line is never split)."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if path else None

    def write(self, record: RequestRecord) -> None:
        if self.fd is not None:
            os.write(self.fd, record_line(record).encode())

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


@events.init.add_listener
def _on_init(environment, **_kwargs) -> None:
    if environment.parsed_options is not None:
        GenerateUser.workload = workload(environment.parsed_options)
        GenerateUser.records = RecordLog(environment.parsed_options.records)
        GenerateUser.order = itertools.count()
        GenerateUser.started = itertools.count()
        options = environment.parsed_options
        GenerateUser.tls = Tls.from_files(options.grpc_tls_cert, options.grpc_tls_key, options.grpc_tls_ca)
        GenerateUser.auth_token = read_token(options.grpc_auth_token_file or None)
        GenerateUser.api = options.api


@events.test_stop.add_listener
def _on_test_stop(environment, **_kwargs) -> None:
    # Locust's CSV is a snapshot taken once a CSV_STATS_INTERVAL_SEC: let one be taken after the last call.
    gevent.sleep(CSV_STATS_INTERVAL_SEC + 0.2)


@events.quit.add_listener
def _on_quit(exit_code, **_kwargs) -> None:  # after the users are stopped
    GenerateUser.records.close()


class GenerateUser(User):
    """One client: a Generate call after another, prompts in turn across all users."""

    wait_time = constant(0)
    workload: Workload
    records: RecordLog
    order: itertools.count
    started: itertools.count  # users started, for the host each takes
    tls: Tls | None = None
    auth_token: str | None = None
    api: str = "grpc"

    def on_start(self) -> None:
        hosts = self.host.split(",")  # several orchestrator replicas: the users take them in turn
        host = hosts[(next(GenerateUser.started) + self.load_index()) % len(hosts)]  # each worker from its own
        if self.api == "openai":
            self.client = OpenAIStream(host, self.workload, self.auth_token, self.options_ca())
        else:
            self.client = GenerationClient(host, timeout_s=self.workload.deadline_s, tls=self.tls,
                                           auth_token=self.auth_token)

    def options_ca(self) -> str | bool:
        options = self.environment.parsed_options
        return (options.grpc_tls_ca or True) if options is not None else True

    def on_stop(self) -> None:
        self.client.close()

    def fire(self, name: str, ms: float, length: int = 0, exception: Exception | None = None) -> None:
        self.environment.events.request.fire(request_type="grpc", name=name, response_time=ms,
                                             response_length=length, exception=exception, context={})

    def load_index(self) -> int:
        """This process's place among the load's (Locust's worker index; 0 alone)."""
        return getattr(self.environment.runner, "worker_index", 0)

    @task
    def generate(self) -> None:
        processes = getattr(self.environment.parsed_options, "load_processes", 1)
        w, n = self.workload, next(self.order) * processes + self.load_index()  # the workers take prompts in turn
        prompt = w.prompts[n % len(w.prompts)]
        sampling = (
            types.SamplingParams(temperature=w.temperature, top_p=w.top_p, seed=n) if w.temperature else types.GREEDY
        )
        users = self.environment.runner.target_user_count * processes  # a worker runs its share
        start_s, tokens, ttft_ms, itls, status = time.time(), 0, None, [], OK
        rounds, parts = Counter(), Counter()
        last = started = time.perf_counter()
        try:
            for count, round_stats in self.events(prompt, sampling):
                now = time.perf_counter()
                if round_stats is not None:
                    rounds.update(rounds=1, plain_rounds=round_stats.drafted == 0, drafted=round_stats.drafted,
                                  accepted=round_stats.accepted)
                    parts.update(round_parts(round_stats))
                if count == 0:
                    continue  # a final chunk that only carries the finish reason
                if ttft_ms is None:
                    ttft_ms = (now - started) * 1e3
                    self.fire("ttft", ttft_ms, count)
                else:
                    gaps = itl_per_token((now - last) * 1e3, count)
                    itls += (round(itl_ms, 3) for itl_ms in gaps)
                    if w.itl_events == "token":
                        for itl_ms in gaps:
                            self.fire("itl", itl_ms, 1)
                    elif w.itl_events == "chunk":
                        self.fire("itl", gaps[0], count)
                tokens, last = tokens + count, now
        except SpecpipeError as err:
            status = err.code
            self.fire("e2e", (time.perf_counter() - started) * 1e3, tokens, StatusError(status))
        else:
            self.fire("e2e", (time.perf_counter() - started) * 1e3, tokens)
        self.records.write(RequestRecord(start_s=start_s, end_s=time.time(), users=users, status=status,
                                         tokens=tokens, ttft_ms=ttft_ms, itl_ms=tuple(itls), prompt_id=prompt.id,
                                         part_ms={part: round(ms, 3) for part, ms in parts.items()}, **rounds))


    def events(self, prompt: Prompt, sampling: types.SamplingParams):
        """(tokens, round statistics or None) per chunk of one generation, on either API."""
        if self.api == "openai":
            yield from self.client.generate(prompt, sampling)
            return
        w = self.workload
        for chunk in self.client.generate(messages=prompt.messages, max_new_tokens=w.max_new_tokens,
                                          sampling=sampling, speculation=w.speculation):
            yield len(chunk.token_ids), chunk.round


class OpenAIStream:
    """One user's /v1/chat/completions calls, streamed; the tokens of each event from the usage that
    continuous_usage_stats puts in it. An error status raises SpecpipeError-like StatusError."""

    def __init__(self, base_url: str, workload: Workload, token: str | None, verify):
        import requests  # Locust's own HTTP client, gevent-friendly

        self.url, self.workload = base_url.rstrip("/"), workload
        self.http = requests.Session()
        self.http.verify = verify
        if token:
            self.http.headers["Authorization"] = f"Bearer {token}"
        models = self.http.get(f"{self.url}/v1/models", timeout=workload.deadline_s)
        if models.status_code != 200:
            raise HttpStatusError(models.status_code)
        self.model = models.json()["data"][0]["id"]

    def generate(self, prompt: Prompt, sampling: types.SamplingParams):
        import requests

        try:
            yield from self._generate(prompt, sampling)
        except requests.RequestException as err:  # no answer at all: what gRPC calls UNAVAILABLE
            raise Unavailable(str(err)) from None

    def _generate(self, prompt: Prompt, sampling: types.SamplingParams):
        w = self.workload
        body = {
            "model": self.model,
            "messages": [{"role": role, "content": content} for role, content in prompt.messages],
            "max_tokens": w.max_new_tokens,
            "temperature": sampling.temperature,
            "top_p": sampling.top_p,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }
        if sampling.seed:
            body["seed"] = sampling.seed
        if w.speculation is not None:
            body.update({k: v for k, v in vars(w.speculation).items() if v})
        with self.http.post(f"{self.url}/v1/chat/completions", json=body, stream=True,
                            timeout=self.workload.deadline_s) as answer:
            if answer.status_code != 200:
                raise HttpStatusError(answer.status_code)
            seen = 0
            for line in answer.iter_lines(decode_unicode=True):
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                if "error" in event:
                    raise HttpStatusError(500)
                tokens = (event.get("usage") or {}).get("completion_tokens", seen)
                if event.get("choices") and tokens > seen:
                    yield tokens - seen, None
                seen = tokens

    def close(self) -> None:
        self.http.close()


class HttpStatusError(SpecpipeError):
    def __init__(self, status: int):
        super().__init__(f"HTTP {status}")
        self.code = f"HTTP_{status}"


class StatusError(Exception):
    """A failed call, named by its gRPC status alone so that Locust counts failures per status."""
