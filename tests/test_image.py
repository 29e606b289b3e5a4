"""The container image (deploy/docker/Dockerfile), built and run here without a Docker daemon.

A Debian bookworm base with python3 is made by mmdebstrap from this machine's own apt sources, the
Dockerfile is built on it with buildah (chroot isolation, the host's network; pip in the build gets
the host's own pip settings through a mounted pip.conf, so the tree names no package index), and the
image's entrypoint runs the three roles for the tiny preset as the manifests run them: as the image's
non-root user, the models volume (prepared by the image's own `models prepare`) mounted read-only.
A Generate through the orchestrator equals the verifier alone. The CPU image must carry torch's CPU
build: asked for the CUDA build, the build fails and says so. .ci/run installs buildah and mmdebstrap.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
USER = "10001:10001"  # the image's user (deploy/docker/Dockerfile, the manifests' runAsUser)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (shutil.which("buildah") and shutil.which("mmdebstrap")),
                       reason="needs buildah and mmdebstrap (Debian packages; .ci/run installs them)"),
]


def host_pip_config(workdir: pathlib.Path) -> tuple[pathlib.Path, list[str]]:
    """This machine's pip settings as a pip.conf for the build, and the local paths it names (mounted
    read-only at the same place)."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    settings: dict[str, str] = {}
    for line in listed.splitlines():  # scope.key='value', environment (:env:) last, so it wins
        scoped, _, value = line.partition("=")
        key = scoped.rsplit(".", 1)[-1]
        if key in ("index-url", "extra-index-url", "find-links", "cert", "trusted-host", "constraint"):
            settings[key] = value.strip("'\"")
    paths = [p for value in settings.values() for p in value.split()
             if p.startswith("/") and os.path.exists(p)]
    conf = workdir / "pip.conf"
    conf.write_text("[global]\n" + "".join(f"{key} = {value}\n" for key, value in settings.items()))
    return conf, [f"{conf}:/etc/pip.conf:ro", *(f"{p}:{p}:ro" for p in paths)]


def run(*cmd: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    """(image name, its base's name, the build's volume flags), removed afterwards."""
    workdir = tmp_path_factory.mktemp("image")
    tag = uuid.uuid4().hex[:8]
    base, image = f"specpipe-test-base:{tag}", f"specpipe-test:{tag}"
    rootfs = workdir / "bookworm.tar"
    made = run("mmdebstrap", "--variant=minbase", "--include=python3,python3-venv,ca-certificates", "bookworm",
               str(rootfs))
    assert made.returncode == 0, made.stderr[-3000:]
    container = run("buildah", "from", "scratch").stdout.strip()
    run("buildah", "add", container, str(rootfs), "/")
    run("buildah", "commit", "-q", container, base)
    run("buildah", "rm", container)
    _, mounts = host_pip_config(workdir)
    volumes = [flag for mount in mounts for flag in ("-v", mount)]
    try:
        yield image, base, volumes
    finally:
        run("buildah", "rmi", "-f", image, base)


def bud(image: str, base: str, volumes: list[str], *args: str) -> subprocess.CompletedProcess:
    return run("buildah", "bud", "--isolation", "chroot", "--network", "host", *volumes,
               "--build-arg", f"BASE=localhost/{base}", "--build-arg", "TORCH_INDEX=",
               "-f", str(ROOT / "deploy" / "docker" / "Dockerfile"), "-t", image, *args, str(ROOT))


def test_the_cpu_image_refuses_a_cuda_build_of_torch(image):
    name, base, volumes = image
    failed = bud(f"{name}-cuda", base, volumes, "--target", "build", "--build-arg", "TORCH_BUILD=cuda")
    assert failed.returncode != 0
    assert "TORCH_BUILD=cuda but pip took torch 2.13.0+cpu" in failed.stdout + failed.stderr


def test_the_image_builds_and_its_three_roles_serve(image, tmp_path):
    name, base, volumes = image
    built = bud(name, base, volumes)
    assert built.returncode == 0, (built.stdout + built.stderr)[-4000:]
    size = run("buildah", "images", "--format", "{{.Size}}", f"localhost/{name}").stdout.strip()
    print(f"image {name}: {size}")  # docs/deploy.md records it

    container = run("buildah", "from", f"localhost/{name}").stdout.strip()
    models, scratch = tmp_path / "models", tmp_path / "tmp"
    for folder in (models, scratch):
        folder.mkdir()
        os.chown(folder, 10001, 10001)

    def specpipe(*args: str, models_mode: str = "ro") -> list[str]:
        return ["buildah", "run", "--isolation", "chroot", "--user", USER, "-v", f"{models}:/models:{models_mode}",
                "-v", f"{scratch}:/tmp", container, "--", "specpipe", *args]

    prepared = run(*specpipe("models", "prepare", "--preset", "tiny", models_mode="rw"))
    assert prepared.returncode == 0, prepared.stderr
    ports = {role: free_port() for role in ("verifier", "drafter", "orchestrator", "http")}
    peers = ["--verifier-addr", f"127.0.0.1:{ports['verifier']}", "--drafter-addr", f"127.0.0.1:{ports['drafter']}",
             "--http-port", str(ports["http"])]
    servers = {}
    try:
        for role in ("verifier", "drafter", "orchestrator"):
            log = open(tmp_path / f"{role}.log", "w")
            servers[role] = subprocess.Popen(
                specpipe("serve", role, "--preset", "tiny", "--port", str(ports[role]), "--metrics-port", "0",
                         *(peers if role == "orchestrator" else ())),
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 180
        while not all("listening on" in (tmp_path / f"{role}.log").read_text() for role in servers):
            assert time.monotonic() < deadline and all(s.poll() is None for s in servers.values()), \
                {role: (tmp_path / f"{role}.log").read_text()[-2000:] for role in servers}
            time.sleep(1)
        verifier_log = (tmp_path / "verifier.log").read_text()
        assert (
            "Traceback" not in verifier_log and "/tmp/.cache/specpipe/kernels" in verifier_log
        )  # not the read-only /models

        def generate(*flags: str) -> dict:
            proc = run(
                sys.executable,
                "-m",
                "specpipe.cli.main",
                "generate",
                "--addr",
                f"127.0.0.1:{ports['orchestrator']}",
                "--prompt",
                "def fibonacci(n):",
                "--max-new-tokens",
                "24",
                "--json",
                *flags,
                timeout=120,
            )
            assert proc.returncode == 0, proc.stderr
            return json.loads(proc.stdout)

        # the default adapts its draft length to measured costs (on a loaded machine it may draft nothing);
        # a fixed draft length shows the drafter service's drafts accepted
        speculative, alone = generate(), generate("--drafter", "none")
        drafted = generate("--drafter", "hybrid", "--draft-len", "4")
        assert speculative["token_ids"] == drafted["token_ids"] == alone["token_ids"] and len(alone["token_ids"]) == 24
        logs = {role: (tmp_path / f"{role}.log").read_text()[-3000:] for role in ("drafter", "orchestrator")}
        assert drafted["stats"]["accepted"] > 0 and drafted["stats"]["rounds"] < alone["stats"]["rounds"], logs
        import httpx  # the OpenAI-compatible API of the same orchestrator: the same text

        answer = httpx.post(f"http://127.0.0.1:{ports['http']}/v1/chat/completions", timeout=120, json={
            "model": "tiny", "messages": [{"role": "user", "content": "def fibonacci(n):"}], "max_tokens": 24,
            "temperature": 0}).json()
        assert answer["choices"][0]["message"]["content"] == alone["text"]
    finally:
        for server in servers.values():
            os.killpg(server.pid, signal.SIGTERM)
        for server in servers.values():
            server.wait(timeout=60)
        run("buildah", "rm", container)
