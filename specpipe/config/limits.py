"""Input caps: how much one request may ask of a service (pure checks, InvalidArgument beyond).

Every size a client chooses is bounded before any work, in the in-process implementations, so the
embedded default and the gRPC services refuse the same requests with the same message. Without
caps a client could ask for a million-token draft, a 10,000-wide tree or a megabyte stop string
and hold a model busy until its deadline (issue 20). docs/security.md lists the flags.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specpipe.core.errors import InvalidArgument
from specpipe.core.settings import setting
from specpipe.core.types import ALL_HYPOTHESES, Draft, GenerationRequest, ProposeRequest

LIMIT_PREFIX = "limit_"  # a cap's key in a mapping of settings: limit_max_prompt_tokens (--limit-prompt-tokens)


@dataclass(frozen=True)
class Limits:
    max_prompt_tokens: int = setting(8192, "prompt tokens of a generation or a prefill")
    max_new_tokens: int = setting(4096, "max_new_tokens of a generation")
    max_draft_len: int = setting(64, "draft_len (k) a request may ask for")  # a client's or an orchestrator's
    max_width: int = setting(16, "tree width a request may ask for")  # at the first levels
    max_hypotheses: int = setting(  # branch schedule pre-drafts per round (-1 = every outcome of <= k + 1)
        16, "branch-schedule hypotheses a request may ask for")
    max_stops: int = setting(16, "stop strings per generation")
    max_stop_chars: int = setting(256, "characters of one stop string")
    max_draft_nodes: int = setting(512, "nodes of a draft tree sent to the verifier")
    max_q_entries: int = setting(1024, "entries of one draft node's sparse q")
    max_id_chars: int = setting(128, "characters of a request id")
    max_session_id_chars: int = setting(  # the orchestrator's: tenant/request id-suffix
        512, "characters of a session id")
    max_prompt_chars: int = setting(1 << 20, "characters of a text prompt")  # before tokenising
    max_request_bytes: int = setting(  # the gRPC server's receive limit, the HTTP API's body cap
        8 << 20, "bytes of one request: a gRPC message (beyond: RESOURCE_EXHAUSTED) or an HTTP body (beyond: 413, "
        "a Content-Length over it refused before any byte is read)")

    def __post_init__(self) -> None:
        bad = [name for name, value in vars(self).items() if value < 1]
        if bad:
            raise ValueError(f"limits must be >= 1: {', '.join(bad)}")

    @property
    def max_context_tokens(self) -> int:
        """Tokens a session's context may hold: a whole prompt plus a whole output."""
        return self.max_prompt_tokens + self.max_new_tokens


DEFAULT_LIMITS = Limits()


HTTP_PREFIX = "http_"  # an HTTP bound's key in a mapping of settings: http_header_timeout (--http-header-timeout)


@dataclass(frozen=True)
class HttpLimits:
    """How the HTTP API bounds its clients (docs/http-api.md, "Overload and slow clients"); 0 = no bound."""

    header_timeout_s: float = setting(
        10.0, "a request's headers must arrive within S seconds of its first byte, else 408 and the connection "
        "closes; 0: no bound", key="header_timeout", metavar="S")
    body_timeout_s: float = setting(30.0, "a request's body must arrive within S seconds of its headers, else 408; "
                                    "0: no bound", key="body_timeout", metavar="S")
    request_timeout_s: float = setting(
        600.0, "an HTTP request's deadline, as a gRPC client's: its wait for a generation slot and its generation "
        "end by then; 0: none", key="request_timeout", metavar="S")
    max_connections: int = setting(
        512, "open HTTP connections per process; one more is answered 503 and closed at once, so a flood of them "
        "leaves the gRPC API its file descriptors; 0: no cap", metavar="N")

    def __post_init__(self) -> None:
        bad = [name for name, value in vars(self).items() if value < 0]
        if bad:
            raise ValueError(f"HTTP limits must be >= 0: {', '.join(bad)}")


DEFAULT_HTTP = HttpLimits()


def at_most(value: int, cap: int, what: str, field: str | None = None) -> None:
    """field: the request field at fault (SpecpipeError.field)."""
    if value > cap:
        raise InvalidArgument(f"{what} is {value}; this server allows at most {cap}", field=field)


def check_id(value: str, what: str, limits: Limits) -> None:
    cap = limits.max_session_id_chars if what == "session_id" else limits.max_id_chars
    at_most(len(value), cap, f"{what} length", what)


def check_generation(request: GenerationRequest, limits: Limits) -> None:
    """The sizes of a generation request: before the prompt is scanned or anything is opened."""
    spec = request.speculation
    check_id(request.request_id, "request_id", limits)
    at_most(len(request.prompt_ids), limits.max_prompt_tokens, "prompt tokens", "prompt")
    at_most(request.max_new_tokens, limits.max_new_tokens, "max_new_tokens", "max_new_tokens")
    at_most(spec.draft_len, limits.max_draft_len, "draft_len", "speculation.draft_len")
    at_most(spec.width, limits.max_width, "width", "speculation.width")
    if spec.hypotheses != ALL_HYPOTHESES:
        at_most(spec.hypotheses, limits.max_hypotheses, "hypotheses", "speculation.hypotheses")
    check_stops(request.stop, limits)


def check_stops(stop: Sequence[str], limits: Limits) -> None:
    at_most(len(stop), limits.max_stops, "the number of stop strings", "stop")
    longest = max((len(s) for s in stop), default=0)
    at_most(longest, limits.max_stop_chars, "the longest stop string's length", "stop")


def check_prompt_text(text: str, limits: Limits, field: str = "prompt") -> None:
    at_most(len(text), limits.max_prompt_chars, "prompt characters", field)


def check_prefill(session_id: str, prompt_ids: Sequence[int], limits: Limits) -> None:
    check_id(session_id, "session_id", limits)
    at_most(len(prompt_ids), limits.max_prompt_tokens, "prompt tokens")


def check_draft(draft: Draft, limits: Limits) -> None:
    """A draft sent for verification: its nodes and its q entries (before the tree is scanned)."""
    at_most(len(draft.tokens), limits.max_draft_nodes, "draft nodes")
    at_most(len(draft.parents), limits.max_draft_nodes, "draft parents")
    if draft.q is not None:
        at_most(len(draft.q), limits.max_draft_nodes, "draft q distributions")
        widest = max((max(len(d.token_ids), len(d.probs)) for d in draft.q), default=0)
        at_most(widest, limits.max_q_entries, "entries of a draft node's q")


def check_propose(request: ProposeRequest, limits: Limits) -> None:
    check_id(request.session_id, "session_id", limits)
    at_most(len(request.context), limits.max_context_tokens, "context tokens")
    at_most(request.draft_len, limits.max_draft_len, "draft_len")
    at_most(request.width, limits.max_width, "width")


def check_lookup(session_id: str, context_suffix: Sequence[int], limits: Limits) -> None:
    """An n-gram store lookup (the store clips k and width to its own NgramConfig)."""
    check_id(session_id, "session_id", limits)
    at_most(len(context_suffix), limits.max_context_tokens, "context_suffix tokens")


DRAFT_NODE_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256)


def draft_nodes_label(nodes: int) -> str:
    """A metric label from a fixed set: the smallest bucket >= nodes ("le_N"), or "gt_256"."""
    bucket = next((b for b in DRAFT_NODE_BUCKETS if nodes <= b), None)
    return f"le_{bucket}" if bucket is not None else f"gt_{DRAFT_NODE_BUCKETS[-1]}"
