"""The processes of `specpipe loadtest`: a `specpipe up` it starts when given no address, the headless
Locust run (deploy/locust/) and a sampler of the services' resident memory (the soak)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specpipe.core.errors import Unavailable
from specpipe.devtools.local_redis import free_port

ROOT = Path(__file__).resolve().parents[2]  # the checkout: deploy/ is not part of the installed package
LOCUSTFILE = ROOT / "deploy" / "locust" / "locustfile.py"
SHAPES_FILE = ROOT / "deploy" / "locust" / "shapes.py"
UP_ROLES = ("orchestrator", "verifier", "drafter")
UP_STOP_S = 30.0


def child_env() -> dict[str, str]:
    """The environment of a child that must import this checkout's specpipe."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def parse_up_table(text: str) -> tuple[dict[str, str], dict[str, int], str | None, dict[str, int]]:
    """`specpipe up`'s table (service, address, metrics, pid, core) -> (addresses, pids) by service
    (a role, or a replica: verifier-2), the URL of its OpenAI-compatible API (None: off), and the
    services' metrics ports."""
    addresses, pids, url, metrics = {}, {}, None, {}
    for line in text.splitlines():
        cells = line.split()
        if len(cells) >= 4 and cells[0].partition("-")[0] in UP_ROLES and cells[3].isdigit():
            addresses[cells[0]], pids[cells[0]] = cells[1], int(cells[3])
            if cells[2].isdigit():
                metrics[cells[0]] = int(cells[2])
        if line.startswith("OpenAI-compatible API:"):
            url = cells[2].removesuffix("/v1")
    return addresses, pids, url, metrics


@dataclass
class Stack:
    """A `specpipe up` of our own: its process and its services' addresses, pids and metrics ports."""

    proc: subprocess.Popen
    addresses: dict[str, str]
    pids: dict[str, int]
    http_url: str | None = None  # the orchestrator's OpenAI-compatible API
    metrics: dict[str, int] = field(default_factory=dict)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # up stops its services in order
            try:
                self.proc.wait(timeout=UP_STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_up(flags: list[str], log_dir: Path, timeout_s: float) -> Stack:
    """`specpipe up --base-port 0 FLAGS`, returned once its ready line is printed."""
    log_dir.mkdir(parents=True, exist_ok=True)
    out_path, err_path = log_dir / "up.out", log_dir / "up.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "specpipe.cli.main", "up", "--base-port", "0",
                                 "--log-dir", str(log_dir), "--log-level", "WARNING", *flags],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=child_env())
    deadline = time.monotonic() + timeout_s
    while "specpipe up: ready" not in (text := out_path.read_text(errors="replace")):
        if proc.poll() is not None:
            tail = err_path.read_text(errors="replace").strip().splitlines()[-10:]
            raise Unavailable(f"specpipe up exited with status {proc.returncode}:\n" + "\n".join(tail))
        if time.monotonic() > deadline:
            Stack(proc, {}, {}).stop()
            raise Unavailable(f"specpipe up not ready after {timeout_s:g} s; see {log_dir}")
        time.sleep(0.2)
    return Stack(proc, *parse_up_table(text))


@dataclass(frozen=True)
class LocustRun:
    """One headless Locust run; its CSV, HTML, per-request records and log go to out_dir."""

    host: str
    out_dir: Path
    shape: str                # constant (users for run_time_s) or one of specpipe.bench.loadshapes.SHAPES
    users: int
    run_time_s: float
    levels: str               # shapes: user counts
    hold_s: float             # shapes: seconds per level
    workload: tuple[str, ...] = field(default=())  # the locustfile's own flags (--suite, --drafter, ...)
    stop_timeout_s: float = 120.0                  # at the end, wait this long for calls in flight
    processes: int = 1                             # Locust's --processes: workers the users are split among

    @property
    def records(self) -> Path:
        return self.out_dir / "requests.jsonl"


def locust_command(run: LocustRun, master_port: int = 5557) -> list[str]:
    """master_port: where Locust's workers meet their master (--processes; Locust's default 5557 is taken
    by any other such run on the host)."""
    files = str(LOCUSTFILE) if run.shape == "constant" else f"{LOCUSTFILE},{SHAPES_FILE}"
    load = (["-u", str(run.users), "-r", str(run.users), "-t", f"{run.run_time_s:g}s"] if run.shape == "constant"
            else ["--shape", run.shape, "--levels", run.levels, "--hold-s", f"{run.hold_s:g}"])
    return [sys.executable, "-m", "locust", "-f", files, "--headless", "--host", run.host, *load,
            "--csv", str(run.out_dir / "locust"), "--csv-full-history", "--html", str(run.out_dir / "locust.html"),
            "--records", str(run.records), "--only-summary", "--loglevel", "WARNING",
            "--stop-timeout", f"{run.stop_timeout_s:g}",  # users end their call: every call is counted
            *(["--processes", str(run.processes), "--master-bind-port", str(master_port), "--master-port",
               str(master_port), "--load-processes", str(run.processes)] if run.processes > 1 else []),
            *run.workload]


def run_locust(run: LocustRun, started: Callable[[int], None] | None = None) -> int:
    """Locust's exit status (1 when a request failed); its output goes to out_dir/locust.log.
    started: told Locust's pid once it runs (the cost sampler watches its CPU)."""
    run.out_dir.mkdir(parents=True, exist_ok=True)
    run.records.unlink(missing_ok=True)
    with open(run.out_dir / "locust.log", "wb") as log:
        proc = subprocess.Popen(locust_command(run, free_port()), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=child_env(), cwd=run.out_dir)
        if started is not None:
            started(proc.pid)
        return proc.wait()


class MemorySampler(threading.Thread):
    """Every every_s seconds, each service's resident memory: (seconds since start, MB) by role, also
    appended to path as JSON lines."""

    def __init__(self, pids: dict[str, int], every_s: float, path: Path):
        super().__init__(daemon=True)
        self.pids, self.every_s, self.path = pids, every_s, path
        self.samples: dict[str, list[tuple[float, float]]] = {role: [] for role in pids}
        self._stop_event = threading.Event()
        self._start_s = time.monotonic()

    def run(self) -> None:
        import psutil

        processes = {role: psutil.Process(pid) for role, pid in self.pids.items()}
        with open(self.path, "a", encoding="utf-8") as out:
            while True:
                t = time.monotonic() - self._start_s
                for role, process in processes.items():
                    try:
                        mb = process.memory_info().rss / 2**20
                    except psutil.Error:
                        continue  # the service is gone: the run reports it as errors
                    self.samples[role].append((t, mb))
                    out.write(json.dumps({"t_s": round(t, 2), "role": role, "rss_mb": round(mb, 2)}) + "\n")
                out.flush()
                if self._stop_event.wait(self.every_s):
                    return

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


LOAD_GENERATOR = "load generator"  # the Locust process (and its workers), in the cost samples


def tree_cpu_s(process: Any, children: dict[int, float]) -> float:
    """A process's CPU seconds with its children's (Locust's workers). children: each child's CPU seconds
    when last seen, kept across calls, so one that has ended (a zombie, or reaped) still counts."""
    import psutil

    times = process.cpu_times()
    for child in process.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.Error:
            continue  # ended meanwhile: its last reading stands
        children[child.pid] = child_times.user + child_times.system
    return times.user + times.system + sum(children.values())


class CostSampler(threading.Thread):
    """Every every_s seconds, every service's counters (its /metrics page) and every process's CPU time
    (the services', and Locust's once watch() names it): specpipe.bench.pipecost's samples."""

    def __init__(self, metrics_ports: dict[str, int], pids: dict[str, int], every_s: float = 1.0):
        super().__init__(daemon=True)
        self.urls = {svc: f"http://127.0.0.1:{port}/metrics" for svc, port in metrics_ports.items()}
        self.pids = dict(pids)
        self._children: dict[int, dict[int, float]] = {}  # pid -> its children's CPU s when last seen (tree_cpu_s)
        self.every_s = every_s
        self.samples: list[Any] = []
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def watch(self, name: str, pid: int) -> None:
        with self._lock:
            self.pids[name] = pid

    def sample(self) -> Any:
        """Every service's counters and every process's CPU time now (a specpipe.bench.pipecost.Sample)."""
        import urllib.request

        import psutil

        from specpipe.bench.pipecost import Sample, parse_counters

        counters = {}
        for svc, url in self.urls.items():
            try:
                with urllib.request.urlopen(url, timeout=2.0) as page:
                    counters[svc] = parse_counters(page.read().decode())
            except OSError:
                continue  # a service gone: the run reports its errors
        cpu = {}
        with self._lock:
            pids = dict(self.pids)
        for name, pid in pids.items():
            try:
                cpu[name] = tree_cpu_s(psutil.Process(pid), self._children.setdefault(pid, {}))
            except psutil.Error:
                continue
        return Sample(time.time(), counters, cpu)

    def run(self) -> None:
        while True:
            self.samples.append(self.sample())
            if self._stop_event.wait(self.every_s):
                self.samples.append(self.sample())
                return

    def stop(self) -> None:
        self._stop_event.set()
        self.join()
