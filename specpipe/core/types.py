"""Value types shared by every service (vocabulary: docs/design.md, "Vocabulary")."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from specpipe.core.settings import setting

ROOT = -1  # parent index of first-level draft nodes: the session's last confirmed token


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = setting(0.0, "0 = greedy")
    top_p: float = setting(1.0, "nucleus mass in (0, 1]")
    top_k: int = setting(0, "0 = off")
    # 0 in a generation request: a fresh random seed (specpipe.runtime.lifecycle.random_seed)
    seed: int = setting(0, "sampling seed; 0 = a fresh random one per generation")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


GREEDY = SamplingParams()


@dataclass(frozen=True)
class SparseDist:
    """A distribution over a few tokens (the drafter's q at one node, truncated and renormalised)."""

    token_ids: tuple[int, ...]
    probs: tuple[float, ...]

    def prob(self, token: int) -> float:
        for t, p in zip(self.token_ids, self.probs):
            if t == token:
                return p
        return 0.0


DRAFT_SOURCES = ("model", "context", "verifier", "global")  # the small model, then the n-gram store's tables
NODE_COLUMNS = ("q", "sources", "confidence", "runner_up", "runner_up_confidence")  # Draft's optional columns


@dataclass(frozen=True)
class Draft:
    """A token tree rooted at the last confirmed token; a chain has parents (-1, 0, 1, ...).

    Besides tokens and parents a node has optional columns (NODE_COLUMNS), each [num_nodes] or None:
    q, the drafter's distribution (None = one-hot: a deterministic draft); sources (DRAFT_SOURCES;
    None = all from the model); and what the branch predictor reads from a drafter with a
    distribution (None for n-gram drafts): the probability of the node's token (confidence), the
    drafter's best other token there (runner_up, -1 = none) and its probability."""

    tokens: tuple[int, ...] = ()                 # [num_nodes]
    parents: tuple[int, ...] = ()                # [num_nodes], parents[i] < i, ROOT for depth 1
    q: tuple[SparseDist, ...] | None = None
    sources: tuple[str, ...] | None = None
    confidence: tuple[float, ...] | None = None
    runner_up: tuple[int, ...] | None = None
    runner_up_confidence: tuple[float, ...] | None = None

    @staticmethod
    def chain(tokens: Sequence[int], q: tuple[SparseDist, ...] | None = None, **columns: Any) -> Draft:
        return Draft(tuple(tokens), tuple(range(-1, len(tokens) - 1)), q, **columns)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

    def node_sources(self) -> tuple[str, ...]:
        return self.sources if self.sources is not None else ("model",) * len(self)

    def select(self, nodes: Sequence[int], parents: Sequence[int] | None = None) -> Draft:
        """The draft of the given nodes, every column kept. parents: each picked node's parent in the
        new draft (default: its old parent, re-indexed, which must then be among nodes or ROOT)."""
        if parents is None:
            mapped = {ROOT: ROOT} | {node: i for i, node in enumerate(nodes)}
            parents = [mapped[self.parents[n]] for n in nodes]

        def pick(column: tuple[Any, ...] | None) -> tuple[Any, ...] | None:
            return None if column is None else tuple(column[n] for n in nodes)

        return Draft(tuple(self.tokens[n] for n in nodes), tuple(parents),
                     **{name: pick(getattr(self, name)) for name in NODE_COLUMNS})


EMPTY_DRAFT = Draft()


@dataclass(frozen=True)
class VerifyResult:
    """The verifier's verdict on one round."""

    accepted_tokens: tuple[int, ...]  # [delta]
    accepted_nodes: tuple[int, ...]   # [delta] draft node index of each accepted token
    correction_token: int             # emitted after the accepted path (the bonus token when all match)
    entropy: float                    # nats, verifier distribution at the correction position
    node_argmax: tuple[int, ...]      # [num_nodes + 1] verifier argmax after the root and each node
    verify_ms: float                  # the forward's time (a batched forward: all its sessions')
    context_len: int                  # session length after this round
    batch_sessions: int = 1           # sessions in the verifier forward this round was part of
    batch_tokens: int = 0             # tokens that forward fed, every session's; 0 = not reported

    @property
    def emitted(self) -> tuple[int, ...]:
        return self.accepted_tokens + (self.correction_token,)


@dataclass(frozen=True)
class RoundRequest:
    """One round of a stream of rounds (Verifier.submit, specpipe.serving.verify_stream)."""

    session_id: str
    context_len: int
    draft: Draft
    sampling: SamplingParams
    tag: int = 0  # the caller's: its reply carries it back
    traceparent: str = ""  # the round's W3C trace context ("": untraced; specpipe.runtime.tracing)


@dataclass(frozen=True)
class ModelInfo:
    model_name: str
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    max_context: int
    vocab_fingerprint: str
    methods: tuple[str, ...] = ()  # a drafter's draft methods (DRAFTER_KINDS); () for a verifier
    # a verifier's: the most tokens of a verify step (last token + draft) that its forward runs in one captured
    # shape with the other sessions' steps; a longer step costs a forward of its own (0: no such bound)
    max_step_tokens: int = 0


@dataclass(frozen=True)
class ProposeRequest:
    """Draft up to draft_len tokens (a chain, or a tree of top-width alternatives) after context."""

    session_id: str
    context: tuple[int, ...]         # the confirmed tokens (prompt + output)
    draft_len: int                   # k
    width: int = 1                   # tree width at the first levels; 1 = chain
    sampling: SamplingParams = GREEDY
    epoch: int = 0  # branch schedule: the session's rollback count; a drafter aborts a proposal older than it saw
    tenant: str = ""  # whose learned store drafts (specpipe.core.tenancy); "" = the default tenant
    stop_confidence: float = 0.0  # greedy: the chain ends after a token the drafter gives less; 0 = all draft_len


@dataclass(frozen=True)
class ProposeResult:
    draft: Draft
    draft_ms: float


DRAFTER_KINDS = ("model", "ngram", "hybrid", "none")  # "none" = the verifier alone
SCHEDULES = ("sequential", "branch")  # branch: draft round r+1 for predicted outcomes while round r verifies
PREDICTORS = ("calibrated", "paper")
ALL_HYPOTHESES = -1  # hypotheses = -1: every outcome of the main chain (the exhaustive method)
ADAPTIVE = ("off", "on")


ADAPTIVE_DRAFT_LEN = 8  # k: the cap of adaptive control, the default
FREE_DRAFT_FACTOR = 4   # adaptive control asks a drafter whose drafts cost nothing (n-gram) for up to this times k
FIXED_DRAFT_LEN = 4     # k with adaptive control off when no draft length is given
# The drafter where a small model of its own can draft: a drafter service on a core or host of its own
# (`up`, `serve orchestrator --drafter-addr`, Kubernetes, Ray), or in one process a preset (or
# --draft-model) whose drafter is a separate small model, drafting only where the n-gram lookup does not
# suffice. SpeculationOptions.drafter where the drafter would be the verifier's own first layers, or no
# drafter service is there. Measured: docs/results/2026-11-25-load-curve-256-tokens.md ("Warm drafters,
# and the hybrid as the served default") and docs/results/2026-11-27-drafter-choice.md.
DRAFTER_WITH_MODEL = "hybrid"


@dataclass(frozen=True)
class SpeculationOptions:
    """How a generation speculates; the defaults here are the product's (CLI and API alike), each
    beside its help text (specpipe.core.settings)."""

    drafter: str = setting(  # one of DRAFTER_KINDS
        "ngram", "draft source: the small model, the n-gram store, both merged into one tree (the n-gram lookup "
        "first, the small model where it does not suffice), or none (the verifier alone)", choices=DRAFTER_KINDS)
    draft_len: int = setting(  # k; with adaptive control its cap
        ADAPTIVE_DRAFT_LEN, f"draft depth per round; with adaptive control its cap ({FREE_DRAFT_FACTOR}x that for "
        "the n-gram drafter, whose drafts cost nothing: the evidence decides what is verified). Given without "
        "--adaptive it fixes the draft depth (adaptive off)", metavar="K", shown=f"{ADAPTIVE_DRAFT_LEN}, adaptive")
    width: int = setting(  # tree width at the first levels; 1 = chain
        1, "tree width at the first draft levels; 1 = chain. With adaptive control the widest tree: each round "
        "keeps only the alternatives whose expected acceptance pays for verifying them")
    schedule: str = setting(  # one of SCHEDULES
        "branch", "sequential: draft, then verify; branch: while the verifier checks a round, draft the next one "
        "for its predicted outcomes, roll back on a miss", choices=SCHEDULES)
    predictor: str = setting(  # one of PREDICTORS (branch schedule)
        "calibrated", "branch schedule: calibrated (drafter confidence, calibrated online) or paper (the fitted "
        "prediction function of Duan et al. 2024, eq. 12)", choices=PREDICTORS)
    hypotheses: int = setting(  # M pre-drafts per round (branch schedule); ALL_HYPOTHESES = all
        1, "branch schedule: outcomes pre-drafted per round, most likely first; all = every outcome of the main "
        "chain", metavar="M")
    adaptive: str = setting(  # "on": choose k (<= draft_len) and M (<= hypotheses) each round
        "on", "on: choose each round's draft length (at most --draft-len, 0 = plain decoding), pre-drafts (at "
        "most --hypotheses) and the draft nodes verified (the tree budget) for the most expected tokens per "
        "second, from the measured verify and draft times, the acceptance per depth, draft source and rank, and "
        "the verifier's entropy; greedy output is unchanged, a sampled one keeps its distribution but no longer "
        "repeats from the seed alone; off: a fixed --draft-len", choices=ADAPTIVE,
        shown="on, unless --draft-len is given")


@dataclass(frozen=True)
class GenerationRequest:
    """A validated generation: token ids in, verified tokens out."""

    prompt_ids: tuple[int, ...]
    max_new_tokens: int
    request_id: str = ""
    stop: tuple[str, ...] = ()
    sampling: SamplingParams = GREEDY
    speculation: SpeculationOptions = field(default_factory=SpeculationOptions)
    tenant: str = ""  # who it is for (specpipe.core.tenancy): its sessions and n-gram tables are the tenant's
    min_new_tokens: int = (
        0  # an EOS before this many outputs does not end the generation (HTTP: min_tokens, ignore_eos)
    )


@dataclass(frozen=True)
class RoundStats:
    drafted: int           # draft nodes sent to the verifier
    accepted: int          # delta
    draft_ms: float
    verify_ms: float
    # Branch schedule: the previous round's hypotheses, which this round's draft could come from
    hypotheses: int = 0     # pre-drafts requested for the previous round's outcome
    hit: bool = False       # the previous round's outcome matched one of them
    wasted: int = 0         # pre-drafted tokens dropped
    hidden_ms: float = 0.0  # draft time of this round's draft that overlapped the previous verification
    idle_ms: float = 0.0    # verifier idle: from the previous verify reply to this verify call
    # Where the round's wall time went, as the orchestrator saw it (ms; ROUND_PARTS): the verifier's
    # prefill (first round only), the wait for this round's draft, draft control (draft length, trim,
    # adaptive learning), the verify call (verify_ms of it the verifier's forward), the emitted text
    # (detokenizing, stop strings), recording (store, metrics) and the rest (between rounds: the
    # consumer of the stream, thread switches). They add up to the generation's wall time.
    prefill_ms: float = 0.0
    wait_ms: float = 0.0
    control_ms: float = 0.0
    call_ms: float = 0.0
    emit_ms: float = 0.0
    record_ms: float = 0.0
    rest_ms: float = 0.0


ROUND_PARTS = ("prefill", "wait", "control", "call", "emit", "record", "rest")  # RoundStats' <part>_ms


@dataclass(frozen=True)
class GenerationChunk:
    request_id: str
    token_ids: tuple[int, ...]  # newly emitted, verified
    text: str                   # text delta
    finish_reason: str          # "" while running, else "eos" | "stop" | "length"
    round: RoundStats | None = None
    seed: int = 0               # the seed the generation samples with (random if the request gave 0); 0 = greedy
    trace_id: str = ""          # the generation's trace (hex) where it is traced: the latency exemplars' link
