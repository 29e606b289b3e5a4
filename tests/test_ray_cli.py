"""`specpipe serve-ray` end to end (slow: a second local Ray): the command starts the application of
a Serve config, `specpipe generate --addr` against Serve's gRPC proxy prints the verifier's own
greedy tokens, and SIGTERM stops it with Ray shut down."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml

from specpipe.engine.models import tiny_model, tiny_tokenizer
from tests.golden import reference_greedy

pytest.importorskip("ray", reason="the ray extra runs the Ray Serve tests")


@pytest.mark.slow
def test_serve_ray_then_generate_addr(tmp_path):
    from tests.test_ray_serve import tiny_config

    config = tiny_config(verifier_replicas=1)
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(config))
    cli = [sys.executable, "-m", "specpipe.cli.main"]
    server = subprocess.Popen([*cli, "serve-ray", "--config", str(path), "--num-cpus", "2"], stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env=os.environ | {"RAY_DEDUP_LOGS": "0"})
    try:
        line = server.stdout.readline()
        assert line.startswith("specpipe serve-ray: listening on"), line
        addr = f"127.0.0.1:{config['grpc_options']['port']}"
        out = subprocess.run([*cli, "generate", "--addr", addr, "--prompt", "def fibonacci(n):", "--raw",
                              "--max-new-tokens", "24", "--json"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        ids = tuple(tiny_tokenizer()("def fibonacci(n):")["input_ids"])
        assert json.loads(out.stdout)["token_ids"] == reference_greedy(tiny_model(), ids, 24)
    finally:
        server.send_signal(signal.SIGTERM)
        assert server.wait(120) == 0
