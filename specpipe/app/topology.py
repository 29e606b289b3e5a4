"""`specpipe up`'s process topology: verifier, drafter and orchestrator replicas as local processes on
loopback (docs/design.md, "Deployment shapes and serving", shape 2), each started with the flags of
`specpipe serve ROLE`, optionally pinned to a core of its own (the stand-in for one accelerator per
service), a private redis-server where asked; stopped in order (SIGTERM, then SIGKILL after a grace;
the redis-server last)."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from specpipe.app import up_security
from specpipe.config.services import METRICS_OFFSET, ModelConfig, TracingConfig, UpConfig
from specpipe.core.errors import SpecpipeError, Unavailable
from specpipe.devtools import local_redis
from specpipe.serving.security import Tls

ROLES = ("verifier", "drafter", "orchestrator")  # start order; the orchestrator needs the other two

HOST = "127.0.0.1"
STOP_GRACE_S = 10.0
TAIL_LINES = 20
READY_LINE = "specpipe serve {role}: listening on {address} (metrics port {metrics})"  # a service's, once SERVING
READY_RE = re.compile(r"^specpipe serve (\w+): listening on (\S+):(\d+) \(metrics port (\d+|off)\)(?: and (\S+))?$")
LOCAL_REDIS = "redis"  # --cache redis: start a local redis-server (specpipe.devtools.local_redis)


@dataclass
class Child:
    role: str  # verifier, drafter, orchestrator; replicas are named verifier-1, verifier-2, ...
    proc: subprocess.Popen
    stdout_path: pathlib.Path
    stderr_path: pathlib.Path
    core: int | None
    port: int | None = None
    metrics_port: int | None = None
    http_url: str | None = None  # the orchestrator's OpenAI-compatible API
    reported: bool = False  # its exit was reported

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"


def run_up(config: UpConfig) -> int:
    """Start everything, print the table, supervise until SIGTERM / SIGINT, stop everything."""
    config.log_dir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())

    names = replica_names(config)
    cores = service_cores(config, tuple(n for role in ROLES for n in names[role]))
    children: dict[str, Child] = {}
    redis: local_redis.LocalRedis | None = None
    try:
        pki = up_security.prepare(config.log_dir, config.tls)
        cache_url = config.cache
        if cache_url == LOCAL_REDIS:
            redis, cache_url = up_security.start_redis(pki)  # a random password; TLS with --tls
        # The drafter serves the ngram / hybrid methods from the store the orchestrator feeds; with the
        # orchestrator's private memory store there is none to share, so the drafter gets none.
        shared = None if cache_url == "memory" else cache_url
        replicas = names["verifier"] + names["drafter"]
        for name in replicas:
            role = name.partition("-")[0]
            children[name] = start_service(name, config, cores.get(name), up_security.service_flags(pki, role)
                                           + simulation_flags(config, role)
                                           + (config.verifier_flags if role == "verifier" else ()),
                                           cache=shared if role == "drafter" else None)
        for name in replicas:
            wait_serving(children[name], config.startup_timeout_s, stop, up_security.client_tls(pki))
        peers = ("--verifier-addr", ",".join(children[n].address for n in names["verifier"]),
                 "--drafter-addr", ",".join(children[n].address for n in names["drafter"]))
        for name in names["orchestrator"]:  # replicas share the verifiers and drafters (and a shared store)
            children[name] = start_service(name, config, cores.get(name),
                                           peers + config.speculation + http_flags(config, name)
                                           + up_security.service_flags(pki, "orchestrator"), cache=cache_url)
        for name in names["orchestrator"]:
            wait_serving(children[name], config.startup_timeout_s, stop, up_security.client_tls(pki))
        if stop.is_set():
            return 0
        _print_table(children, config, redis, up_security.describe(pki))
        while not stop.wait(0.1):
            check_children(children, names)
            if redis is not None and redis.process.poll() is not None:
                raise Unavailable(f"redis-server on {redis.address} exited with status {redis.process.returncode}")
        print("specpipe up: stopping", file=sys.stderr, flush=True)
        return 0
    except _Stopped:
        return 0
    except SpecpipeError as err:
        print(f"specpipe up: error: {err}", file=sys.stderr, flush=True)
        return 1
    finally:
        stop_all(list(children.values())[::-1], STOP_GRACE_S + config.drain_timeout_s)
        if redis is not None:
            redis.stop()  # last: the services may still write to it while they stop


def replica_names(config: UpConfig) -> dict[str, tuple[str, ...]]:
    """role -> its processes' names: the role itself when it has one replica, else role-1, role-2, ..."""
    counts = {"verifier": config.verifiers, "drafter": config.drafters, "orchestrator": config.orchestrators}
    return {role: (role,) if n == 1 else tuple(f"{role}-{i}" for i in range(1, n + 1)) for role, n in counts.items()}


def check_children(children: dict[str, Child], names: dict[str, tuple[str, ...]]) -> None:
    """A replica that exits (killed, drained) is reported once; the orchestrator routes around it.
    Unavailable when the orchestrator or the last replica of a role is gone."""
    for name, child in children.items():
        if child.proc.poll() is not None and not child.reported:
            child.reported = True
            print(f"specpipe up: {name} exited with status {child.proc.returncode}", file=sys.stderr, flush=True)
    for role, role_names in names.items():
        if all(children[n].proc.poll() is not None for n in role_names):
            raise Unavailable(_died(children[role_names[-1]]))


class _Stopped(Exception):
    """Ctrl-C / SIGTERM during startup."""


def service_cores(config: UpConfig, roles: tuple[str, ...]) -> dict[str, int]:
    """One core per role with --pin, when there are enough for the model services (verifiers and
    drafters); the orchestrator, which runs no model, gets a core of its own only if one is left."""
    if not config.pin:
        return {}
    available = sorted(os.sched_getaffinity(0))
    models = tuple(r for r in roles if not r.startswith("orchestrator"))
    if len(available) < len(models):
        print(f"specpipe: pinning needs {len(models)} cores, this process may use {len(available)}; not pinning",
              file=sys.stderr, flush=True)
        return {}
    return dict(zip(models + tuple(r for r in roles if r not in models), available))


def port_offset(name: str, config: UpConfig) -> int:
    """orchestrator N, verifiers N+1.., drafters after them (N+1, N+2 with one replica each), more
    orchestrators after those."""
    role, _, index = name.partition("-")
    i = int(index or 1) - 1
    after = 1 + config.verifiers + config.drafters
    offsets = {"orchestrator": 0 if i == 0 else after + i - 1, "verifier": 1 + i, "drafter": 1 + config.verifiers + i}
    return offsets[role]


def start_service(name: str, config: UpConfig, core: int | None, extra: tuple[str, ...],
                  cache: str | None = None) -> Child:
    """cache: the child's n-gram store URL (None: none). It goes in the environment (SPECPIPE_CACHE),
    not the command line: it may hold the private redis-server's password, and any user of the
    machine can read a command line, only this user a process's environment (docs/security.md)."""
    role, offset = name.partition("-")[0], port_offset(name, config)
    port, metrics_port = (0, 0) if config.base_port == 0 else (
        config.base_port + offset, config.base_port + METRICS_OFFSET + offset)
    cmd = [sys.executable, "-m", "specpipe.cli.main", "serve", role, "--host", HOST, "--port", str(port),
           "--drain-timeout", str(config.drain_timeout_s), "--metrics-port", str(metrics_port),
           *model_flags(config.model), "--threads", str(config.threads_per_service), "--log-level", config.log_level,
           *tracing_flags(config.tracing), *extra]
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS=str(config.threads_per_service),
               MKL_NUM_THREADS=str(config.threads_per_service))
    env.pop("SPECPIPE_CACHE", None)  # only the store given: a drafter must not pick one up on its own
    if cache is not None:
        env["SPECPIPE_CACHE"] = cache
    root = str(pathlib.Path(__file__).resolve().parents[2])  # so the children import this checkout
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    stdout_path, stderr_path = config.log_dir / f"{name}.out", config.log_dir / f"{name}.err"
    with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env,
                                start_new_session=True,  # signals come from us, in order, not from the terminal
                                preexec_fn=lambda: _child_setup(core))
    return Child(name, proc, stdout_path, stderr_path, core)


def tracing_flags(config: TracingConfig) -> tuple[str, ...]:
    """Every service's tracing flags (its trace file's path absolute: the children may run elsewhere)."""
    file = ("--trace-file", str(pathlib.Path(config.trace_file).resolve())) if config.trace_file else ()
    return ("--tracing", "on" if config.enabled else "off", "--trace-ratio", str(config.trace_ratio), *file)


def simulation_flags(config: UpConfig, role: str) -> tuple[str, ...]:
    """A model service's simulated device: the cost model and the replay."""
    def absolute(path: str) -> str:  # the children may run elsewhere
        return str(pathlib.Path(path).resolve()) if pathlib.Path(path).exists() else path

    flags = ("--cost-model", absolute(config.cost_model)) if config.cost_model else ()
    return flags + (("--replay", absolute(config.replay)) if config.replay else ())


def http_flags(config: UpConfig, name: str = "orchestrator") -> tuple[str, ...]:
    """An orchestrator's --http-port: the configured one (the first replica), a free one with free
    ports or for the other replicas, or none."""
    if config.http_port is None:
        return ()
    first = name in ("orchestrator", "orchestrator-1")
    return ("--http-port", str(config.http_port if config.base_port != 0 and first else 0))


def model_flags(model: ModelConfig) -> tuple[str, ...]:
    """The flags that give a `specpipe serve` process this model config (its threads aside)."""
    flags = (
        "--preset",
        model.preset,
        "--device",
        model.device,
        "--dtype",
        model.dtype,
        "--compile",
        model.compile,
        "--draft-weights",
        model.draft_weights,
        "--verifier-weights",
        model.verifier_weights,
        "--batching",
        "on" if model.batching else "off",
    )
    return flags + (("--verifier", model.verifier) if model.verifier else ()) + (
        ("--draft-model", model.draft_model) if model.draft_model else ())


def _child_setup(core: int | None) -> None:
    """Runs in the child before exec: die with the parent, and pin to one core."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass
    if core is not None:
        os.sched_setaffinity(0, {core})


def wait_serving(child: Child, timeout_s: float, stop: threading.Event, tls: Tls | None = None) -> None:
    """Wait for the child's ready line, then for its health to be SERVING."""
    from specpipe.serving.clients import VerifierClient

    deadline = time.monotonic() + timeout_s
    while child.port is None:
        if stop.is_set():
            raise _Stopped
        if child.proc.poll() is not None:
            raise Unavailable(_died(child))
        if time.monotonic() > deadline:
            raise Unavailable(f"{child.role} not ready after {timeout_s:g} s; see {child.stderr_path}")
        for line in child.stdout_path.read_text(errors="replace").splitlines():
            if match := READY_RE.match(line.strip()):
                child.port = int(match.group(3))
                child.metrics_port = None if match.group(4) == "off" else int(match.group(4))
                child.http_url = match.group(5)
        time.sleep(0.1)
    with VerifierClient(child.address, timeout_s=1.0, tls=tls) as client:  # any client has health()
        while True:
            if stop.is_set():
                raise _Stopped
            if child.proc.poll() is not None:
                raise Unavailable(_died(child))
            try:
                if client.health("") == "SERVING":
                    return
            except SpecpipeError:
                pass
            if time.monotonic() > deadline:
                raise Unavailable(f"{child.role} on {child.address} not SERVING after {timeout_s:g} s")
            time.sleep(0.1)


def _died(child: Child) -> str:
    lines = child.stderr_path.read_text(errors="replace").splitlines()[-TAIL_LINES:]
    tail = "\n".join(f"    {line}" for line in lines) or "    (no output)"
    return f"{child.role} exited with status {child.proc.returncode}; last lines of {child.stderr_path}:\n{tail}"


def _print_table(children: dict[str, Child], config: UpConfig, redis: local_redis.LocalRedis | None,
                 security: str = "") -> None:
    rows = [("service", "address", "metrics", "pid", "core")]
    for name in sorted(children, key=lambda n: (ROLES.index(n.partition("-")[0]) + 1) % len(ROLES)):
        c = children[name]
        rows.append(
            (name, c.address, str(c.metrics_port or "-"), str(c.proc.pid), "-" if c.core is None else str(c.core))
        )
    if redis is not None:
        rows.append(("redis", redis.address, "-", str(redis.process.pid), "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip())
    url = next((c.http_url for c in children.values() if c.http_url), None)
    if url:
        print(f"OpenAI-compatible API: {url}/v1 (curl {url}/v1/models)")
    print(f"specpipe up: ready (preset {config.model.preset}); logs in {config.log_dir}; Ctrl-C stops all services"
          f"{security}", flush=True)


def stop_all(children: list[Child], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every child (graceful drain and stop), SIGKILL what is left after grace_s."""
    for child in children:
        if child.proc.poll() is None:
            child.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    for child in children:
        try:
            child.proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            child.proc.kill()
            child.proc.wait()
