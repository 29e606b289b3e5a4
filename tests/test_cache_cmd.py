"""`specpipe cache seed`: text and .jsonl files land in the learned store of a real redis-server (or a
cache service over gRPC) exactly as specpipe.core.learned.learn of each chunk, one document each,
would leave it, and a fresh session then drafts from them (source "global"). Plus the store URL
forms (open_store) and `specpipe up --cache redis` (a local redis-server shared by the orchestrator
and the drafter)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from cache_service import servicer
from cache_service.memory import InMemoryNgramCache
from cache_service.redis_store import RedisNgramCache, connect, read_learned_store
from cache_service.stores import open_store
from specpipe.app.seed import chunks, jsonl_text
from specpipe.cli.main import main
from specpipe.core import learned
from specpipe.core.errors import InvalidArgument
from specpipe.core.learned import MATCH_TOKENS, LearnedStore
from specpipe.core.ngram import NgramConfig, apply_updates, learned_draft
from specpipe.serving.cache_client import CacheClient
from specpipe.serving.clients import GenerationClient
from specpipe.serving.server import ServerConfig, serve
from tests.redis_harness import redis_url  # noqa: F401  (fixture)

CODE = "def add(a, b):\n    return a + b\n"
JSONL = [{"text": "The quick brown fox jumps over the lazy dog."}, {"title": "Zebra", "body": "xylophone quartz"},
         {"n": 3}, "just a string"]


@pytest.mark.parametrize("length, size, overlap, expected", [
    (10, 4, 1, [(0, 4), (3, 7), (6, 10)]),
    (10, 4, 2, [(0, 4), (2, 6), (4, 8), (6, 10)]),
    (4, 4, 3, [(0, 4)]),
    (2, 4, 3, [(0, 2)]),
    (1, 4, 3, []),  # no n-gram in one token
    (0, 4, 3, []),
], ids=["overlap 1", "overlap 2", "exactly one window", "short", "one token", "empty"])
def test_chunks(length, size, overlap, expected):
    tokens = list(range(length))
    assert list(chunks(tokens, size, overlap)) == [tokens[a:b] for a, b in expected]


def test_chunks_with_an_overlap_of_n_minus_1_leave_the_table_of_one_pass():
    config, tokens = NgramConfig(max_n=4, max_continuations=2), [i % 5 for i in range(3, 60)] + [1, 2, 1, 2, 1, 3]
    one_pass, chunked = {}, {}
    apply_updates(one_pass, tokens, 0, config)
    for chunk in chunks(tokens, 7, config.max_n - 1):
        apply_updates(chunked, chunk, 0, config)
    assert chunked == one_pass


@pytest.mark.parametrize("record, text", [
    ({"text": "a", "title": "b"}, "a"),
    ({"title": "b", "n": 1, "body": "c"}, "b\nc"),
    ({"n": 1}, ""),
    ("plain", "plain"),
    ([1, 2], ""),
])
def test_jsonl_text(record, text):
    assert jsonl_text(record) == text


def _write_corpus(tmp_path):
    code, notes = tmp_path / "add.py", tmp_path / "notes.jsonl"
    code.write_text(CODE)
    notes.write_text(
        "\n".join(json.dumps(r) for r in JSONL[:2]) + "\n\n" + "\n".join(json.dumps(r) for r in JSONL[2:]) + "\n"
    )
    return code, notes


def _reference_store(tokenizer, chunk_tokens: int) -> LearnedStore:
    config, store = NgramConfig(), LearnedStore()
    for text in [CODE] + [jsonl_text(r) for r in JSONL]:
        for chunk in chunks(tokenizer(text, add_special_tokens=False)["input_ids"], chunk_tokens, MATCH_TOKENS):
            learned.learn(store, chunk, config.learned)
    return store


def test_seed_redis_then_a_fresh_session_drafts_from_the_learned_store(redis_url, tmp_path, tiny_tokenizer, capsys):  # noqa: F811
    connect(redis_url).flushdb()
    files = _write_corpus(tmp_path)
    assert (
        main(["cache", "seed", *map(str, files), "--cache", redis_url, "--preset", "tiny", "--chunk-tokens", "65"]) == 0
    )
    summary = capsys.readouterr().out.strip()
    num_tokens = sum(
        len(tiny_tokenizer(t, add_special_tokens=False)["input_ids"])
        for t in [CODE] + [jsonl_text(r) for r in JSONL]
        if t
    )
    assert summary.startswith(f"specpipe cache seed: 4 documents, {num_tokens} tokens, ") and redis_url in summary

    reference = _reference_store(tiny_tokenizer, 65)
    assert read_learned_store(connect(redis_url)) == reference

    cache = RedisNgramCache.from_url(redis_url)
    context = tiny_tokenizer("def add(a, b):\n    ret", add_special_tokens=False)["input_ids"]
    result = cache.lookup("a-fresh-session", context, 6, 1)
    assert result == learned_draft(learned.lookup(reference, context, 6, 1, NgramConfig().learned))
    assert tiny_tokenizer.decode(result.draft.tokens) == "urn a " and result.sources == ("global",) * 6
    cache.close()


def test_seed_a_cache_service_over_grpc(tmp_path, tiny_tokenizer, capsys):
    store = InMemoryNgramCache()
    with serve([servicer.service(store)], ServerConfig(port=0, max_workers=2, grace_s=0)) as server:
        url = f"grpc://{server.address}"
        assert main(["cache", "seed", str(_write_corpus(tmp_path)[0]), "--cache", url, "--preset", "tiny"]) == 0
    assert capsys.readouterr().out.startswith("specpipe cache seed: 1 documents, ")
    context = tiny_tokenizer("The quick", add_special_tokens=False)["input_ids"]
    assert store.lookup("s", context, 3, 1).draft.tokens == ()  # only add.py was seeded
    context = tiny_tokenizer("(a, b)", add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(store.lookup("s", context, 4, 1).draft.tokens) == ":\n  "


def test_seed_a_tenants_global_table(tmp_path, tiny_tokenizer, capsys):
    """--tenant: the corpus drafts for that tenant only (docs/security.md, "Tenants")."""
    store = InMemoryNgramCache()
    with serve([servicer.service(store)], ServerConfig(port=0, max_workers=2, grace_s=0)) as server:
        assert main(["cache", "seed", str(_write_corpus(tmp_path)[0]), "--cache", f"grpc://{server.address}",
                     "--preset", "tiny", "--tenant", "team-a"]) == 0
    assert "in tenant team-a's learned store of grpc://" in capsys.readouterr().out
    context = tiny_tokenizer("(a, b)", add_special_tokens=False)["input_ids"]
    assert tiny_tokenizer.decode(store.lookup("s", context, 4, 1, tenant="team-a").draft.tokens) == ":\n  "
    assert store.lookup("s", context, 4, 1).draft.tokens == ()  # not the default tenant's
    assert store.lookup("s", context, 4, 1, tenant="team-b").draft.tokens == ()
    assert main(["cache", "seed", str(tmp_path / "add.py"), "--cache", "redis://127.0.0.1:1", "--preset", "tiny",
                 "--tenant", "no spaces"]) == 2
    assert "tenant id 'no spaces' is not valid" in capsys.readouterr().err


@pytest.mark.parametrize("files, cache, message", [
    (["a.txt"], "memory", "--cache memory would seed this process's own store"),
    (["a.txt"], "redis", "the bare word redis"),
    (["a.txt"], "http://x", "unknown n-gram store 'http://x'"),
    (["a.txt", "missing.txt"], "redis://127.0.0.1:1", "missing.txt: no such file"),
], ids=["memory", "bare redis", "unknown scheme", "missing file"])
def test_seed_errors_exit_2(files, cache, message, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("hello")
    assert main(["cache", "seed", *files, "--preset", "tiny", "--cache", cache]) == 2
    assert message in capsys.readouterr().err


def test_seed_redis_down_exits_2(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("hello")
    assert main(["cache", "seed", str(tmp_path / "a.txt"), "--cache", "redis://127.0.0.1:1", "--preset", "tiny",
                 "--timeout", "1"]) == 2
    assert "redis at redis://127.0.0.1:1" in capsys.readouterr().err


def test_open_store_forms(redis_url):  # noqa: F811
    assert isinstance(open_store("memory"), InMemoryNgramCache)
    redis_store = open_store(redis_url, NgramConfig(max_n=3))
    assert isinstance(redis_store, RedisNgramCache) and redis_store.config.max_n == 3
    redis_store.close()
    with open_store("grpc://127.0.0.1:1", timeout_s=0.5) as client:
        assert isinstance(client, CacheClient) and client.target == "127.0.0.1:1"
    for url in ("redis", "grpc://", "memcached://x", ""):
        with pytest.raises(InvalidArgument, match="use one of: memory"):
            open_store(url)


@pytest.mark.slow  # three service processes and a redis-server
def test_specpipe_up_with_a_local_redis(tmp_path):
    """`specpipe up --cache redis` starts a redis-server, lists it with the services, gives it to the
    orchestrator and the drafter (ngram drafts come from it), and stops it with the others."""
    from tests.test_contract_generation import specpipe_up

    with specpipe_up(tmp_path, "--cache", "redis", "--drafter", "ngram") as (proc, lines):
        table = {line.split()[0]: line.split()[1:4] for line in lines if line.split()}
        redis_address, _, redis_pid = table["redis"]
        urls = {role: _cache_url(int(table[role][2])) for role in ("orchestrator", "drafter")}
        assert urls["orchestrator"] == urls["drafter"] and urls["orchestrator"].endswith(f"@{redis_address}")
        stats = connect(urls["orchestrator"])  # the private server has a random password
        with GenerationClient(table["orchestrator"][0], timeout_s=60) as client:
            chunks_ = list(client.generate(prompt="abcabcabcabc", max_new_tokens=8))
        assert sum(len(c.token_ids) for c in chunks_) == 8
        calls = stats.info("commandstats")["cmdstat_evalsha"]["calls"]
        assert calls >= 1  # the verifier's rejected-draft branches (and any lookups) went to this redis-server
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0, proc.stderr.read()
    assert not os.path.exists(f"/proc/{redis_pid}")  # stopped (and reaped) with the services


def _cache_url(pid: int) -> str:
    """A child's store URL: in its environment, not on its command line (it holds the password)."""
    with open(f"/proc/{pid}/environ", "rb") as f:
        environ = dict(item.split("=", 1) for item in f.read().decode().split("\0") if "=" in item)
    return environ["SPECPIPE_CACHE"]
