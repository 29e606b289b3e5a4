"""The figure of docs/ray.md: replica counts of the verifier and drafter deployments over time, from
Serve's own status (serve.status()), while a load of concurrent Generate streams comes and goes.

    PYTHONPATH=. python3 scripts/ray_autoscale.py --out docs/figures/ray_autoscale

Starts the application of deploy/ray/serve.yaml on a local Ray (tiny preset, free ports, the
autoscaling of --config), idles, loads it with --streams client threads through the gRPC proxy,
idles again, and writes OUT.json (samples and the deployments' config) and OUT.png."""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time

DEPLOYMENTS = ("Verifier", "Drafter", "Orchestrator")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def demo_config(path: str | None, settings: dict) -> dict:
    from specpipe.rayserve import launch

    config = launch.load_config(path) if path else launch.load_config()
    config["http_options"]["port"], config["grpc_options"]["port"] = free_port(), free_port()
    app = config["applications"][0]
    app["args"] = {"verifier": settings, "drafter": settings, "orchestrator": {**settings, "drafter": "model"}}
    for deployment in app["deployments"]:  # small shares: 2 CPUs hold every replica the autoscaler asks for
        deployment["ray_actor_options"]["num_cpus"] = 0.2
    return config


def running(status) -> dict[str, int]:
    deployments = status.applications["specpipe"].deployments
    return {name: deployments[name].replica_states.get("RUNNING", 0) if name in deployments else 0
            for name in DEPLOYMENTS}


def load(addr: str, streams: int, stop: threading.Event, counts: dict) -> list[threading.Thread]:
    from specpipe.core.types import SpeculationOptions
    from specpipe.serving.clients import GenerationClient

    speculation = SpeculationOptions(drafter="model", draft_len=4, schedule="branch", adaptive="off")

    def worker(i: int) -> None:
        with GenerationClient(addr, timeout_s=300) as client:
            while not stop.is_set():
                for chunk in client.generate(prompt=f"request {i}: once upon a time", max_new_tokens=64,
                                             speculation=speculation):
                    counts["tokens"] += len(chunk.token_ids)

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(streams)]
    for t in threads:
        t.start()
    return threads


def plot(samples: list[dict], phases: dict, out: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    t = [s["t"] for s in samples]
    for name in ("Verifier", "Drafter"):
        ax.step(t, [s[name] for s in samples], where="post", label=name.lower())
    ax.axvspan(phases["load_start"], phases["load_end"], alpha=0.12, color="gray", label="load")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("running replicas (serve.status)")
    ax.set_yticks(range(0, max(max(s["Verifier"], s["Drafter"]) for s in samples) + 2))
    ax.legend(loc="upper left")
    ax.set_title("Ray Serve autoscaling: drafter and verifier replicas under a Generate load")
    fig.tight_layout()
    fig.savefig(f"{out}.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="docs/figures/ray_autoscale")
    parser.add_argument("--config", default=None, help="Serve config (default: deploy/ray/serve.yaml)")
    parser.add_argument("--streams", type=int, default=8, help="concurrent Generate streams during the load")
    parser.add_argument("--idle-s", type=float, default=20)
    parser.add_argument("--load-s", type=float, default=120)
    parser.add_argument("--after-s", type=float, default=90)
    args = parser.parse_args()

    import ray
    from ray import serve

    from specpipe.rayserve import launch

    config = demo_config(args.config, {"preset": "tiny", "threads": 1})
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    samples, counts, stop = [], {"tokens": 0}, threading.Event()
    try:
        launch.start(config, timeout_s=300)
        addr = f"127.0.0.1:{config['grpc_options']['port']}"
        start = time.monotonic()
        phases = {"load_start": args.idle_s, "load_end": args.idle_s + args.load_s}
        threads: list[threading.Thread] = []
        while (now := time.monotonic() - start) < args.idle_s + args.load_s + args.after_s:
            if not threads and now >= phases["load_start"]:
                threads = load(addr, args.streams, stop, counts)
            if threads and now >= phases["load_end"]:
                stop.set()
            samples.append({"t": round(now, 1), "tokens": counts["tokens"], **running(serve.status())})
            print(samples[-1], flush=True)
            time.sleep(1.0)
    finally:
        stop.set()
        ray.shutdown()
    deployments = {d["name"]: {k: d[k] for k in ("autoscaling_config", "max_ongoing_requests", "max_queued_requests")}
                   for d in config["applications"][0]["deployments"]}
    with open(f"{args.out}.json", "w") as f:
        json.dump({"streams": args.streams, "phases": phases, "deployments": deployments, "samples": samples}, f,
                  indent=1)
    plot(samples, phases, args.out)


if __name__ == "__main__":
    main()
