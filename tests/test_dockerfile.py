"""deploy/docker/Dockerfile, checked without a Docker daemon (none here): the properties the image must
have, read from the file. What only a build can show (that it builds, its size) is not checked here."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCKERFILE = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()


def stages() -> list[list[str]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE)
    out: list[list[str]] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.upper().startswith("FROM "):
            out.append([])
        if out:
            out[-1].append(line)
    return out


def test_multi_stage_with_selectable_cpu_or_cuda_base():
    build, final = stages()
    assert re.match(r"FROM \$\{BASE\} AS build", build[0]) and re.match(r"FROM \$\{BASE\} AS runtime", final[0])
    assert re.search(r"^ARG BASE=python:", DOCKERFILE, re.M) and "nvidia/cuda" in DOCKERFILE
    assert any(i.startswith("COPY --from=build") for i in final)


def test_final_stage_runs_as_non_root_with_the_role_as_command():
    final = stages()[-1]
    user = [i for i in final if i.startswith("USER ")]
    assert user and not re.match(r"USER (root|0)\b", user[-1])
    assert 'ENTRYPOINT ["specpipe"]' in final
    assert any("SPECPIPE_HOME=/models" in i for i in final) and 'VOLUME ["/models"]' in final


def test_the_image_installs_specpipe_with_opentelemetry():
    """--tracing on works in the image: the otel extra (the SDK, the OTLP exporters) is installed."""
    build = " ".join(stages()[0])
    assert re.search(r'pip install "/src\[otel\]"', build)


def test_no_build_tools_or_models_in_the_final_stage():
    final = " ".join(stages()[-1])
    for tool in ("pip install", "grpcio-tools", "build-essential", "git ", "models prepare"):
        assert tool not in final, tool
    # the one compiler kept is for --compile on (the packed GEMM on a CPU), and can be left out
    assert "gcc" in final and "RUNTIME_CC" in final
    assert "rm -rf /var/lib/apt/lists/*" in final
