"""The Ray Serve application scaled out over a multi-node Ray cluster on this machine
(ray.cluster_utils.Cluster: a head and one node per verifier replica, each its own raylet), with
simulated verifiers (--cost-model): aggregate tokens/s through Serve's gRPC proxy with one and with
two verifier replicas on different nodes, and then a node killed mid-load: every stream must finish
with the verifier alone's tokens (docs/pipeline.md, "Scale out").

    PYTHONPATH=. python3 scripts/ray_scaleout.py --out bench-results/DATE-ray-scaleout/result.json

The verifier runs the tiny preset (its real forward computes every token) held to a slow curve (the
H200's times x --scale), so that the verifiers, not this machine's two cores, bound the load: the
question is whether a second replica on another node doubles what the deployment serves, and
whether losing a node loses a token."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NODE_RESOURCE = "verifier_node"  # one a worker node: each verifier replica takes a node of its own


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def app_config(replicas: int, curve: str, drafter: str) -> dict:
    from specpipe.rayserve import launch

    config = launch.load_config()
    config["http_options"]["port"], config["grpc_options"]["port"] = free_port(), free_port()
    app = config["applications"][0]
    settings = {"preset": "tiny", "threads": 1}
    app["args"] = {"verifier": {**settings, "cost_model": curve, "max_sessions": 128},
                   "drafter": settings, "orchestrator": {**settings, "drafter": drafter, "max_sessions": 128}}
    for deployment in app["deployments"]:
        deployment.pop("autoscaling_config")
        verifier = deployment["name"] == "Verifier"
        deployment["num_replicas"] = replicas if verifier else 1
        deployment["max_ongoing_requests"] = 128
        deployment["ray_actor_options"] = ({"num_cpus": 0.1, "resources": {NODE_RESOURCE: 1}} if verifier
                                           else {"num_cpus": 0.1})
    return config


def load(port: int, streams: int, seconds: float, prompts, max_new_tokens: int) -> tuple[int, list]:
    """streams client threads, each generating again and again for seconds; (tokens, outputs)."""
    from specpipe.serving.clients import GenerationClient

    stop, tokens, outputs, lock = time.monotonic() + seconds, [0], [], threading.Lock()

    def user(i: int) -> None:
        with GenerationClient(f"127.0.0.1:{port}", timeout_s=600.0) as client:
            n = i
            while time.monotonic() < stop:
                prompt = prompts[n % len(prompts)]
                out = [t for c in client.generate(token_ids=prompt, max_new_tokens=max_new_tokens) for t in c.token_ids]
                with lock:
                    tokens[0] += len(out)
                    outputs.append((tuple(prompt), out))
                n += streams

    threads = [threading.Thread(target=user, args=(i,)) for i in range(streams)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return tokens[0], outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="the result JSON")
    parser.add_argument(
        "--scale", type=float, default=20.0, help="the H200 curve's times x this (default: %(default)s)"
    )
    parser.add_argument("--streams", type=int, default=24, help="concurrent Generate streams (default: %(default)s)")
    parser.add_argument("--seconds", type=float, default=40.0, help="load per measurement (default: %(default)s)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--drafter", default="ngram", help="the orchestrator's drafter (default: %(default)s)")
    args = parser.parse_args()

    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from specpipe.engine.models import tiny_model, tiny_tokenizer
    from specpipe.rayserve import launch
    from tests.golden import GOLDEN_PROMPTS, reference_greedy

    tokenizer = tiny_tokenizer()
    prompts = [tokenizer(p)["input_ids"] for p in GOLDEN_PROMPTS]
    reference = {tuple(p): reference_greedy(tiny_model(), p, args.max_new_tokens) for p in prompts}
    curve = f"nvidia-h200-qwen-coder:x{args.scale:g}"
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 2})
    nodes = [cluster.add_node(num_cpus=1, resources={NODE_RESOURCE: 1}) for _ in range(2)]
    pythonpath = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    ray.init(address=cluster.address, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}}, log_to_driver=False)
    result: dict = {"curve": curve, "streams": args.streams, "seconds": args.seconds,
                    "max_new_tokens": args.max_new_tokens, "drafter": args.drafter, "runs": {}}
    try:
        for replicas in (1, 2):
            config = app_config(replicas, curve, args.drafter)
            launch.start(config, timeout_s=600.0)
            port = config["grpc_options"]["port"]
            load(port, 2, 5.0, prompts, args.max_new_tokens)  # warm-up
            start = time.monotonic()
            tokens, outputs = load(port, args.streams, args.seconds, prompts, args.max_new_tokens)
            elapsed = time.monotonic() - start
            lossless = sum(out == reference[p] for p, out in outputs)
            result["runs"][str(replicas)] = {"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed,
                                             "generations": len(outputs), "equal_to_verifier_alone": lossless}
            print(f"{replicas} verifier replica(s): {tokens / elapsed:.1f} tokens/s, {lossless}/{len(outputs)} "
                  "equal to the verifier alone", flush=True)
            if replicas == 2:  # a node dies mid-load: its sessions re-prefill on the other replica
                killer = threading.Timer(args.seconds / 3, lambda: cluster.remove_node(nodes[1]))
                killer.start()
                tokens, outputs = load(port, args.streams, args.seconds, prompts, args.max_new_tokens)
                killer.join()
                lossless = sum(out == reference[p] for p, out in outputs)
                result["node_killed"] = {"generations": len(outputs), "equal_to_verifier_alone": lossless,
                                         "tokens": tokens}
                print(f"a node killed mid-load: {lossless}/{len(outputs)} generations equal to the verifier alone",
                      flush=True)
            serve.shutdown()
        result["scaling"] = result["runs"]["2"]["tokens_per_s"] / result["runs"]["1"]["tokens_per_s"]
        print(f"two replicas / one: {result['scaling']:.2f}x", flush=True)
    finally:
        ray.shutdown()
        cluster.shutdown()
        out = pathlib.Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
