"""The layers of specpipe/ (specpipe/__init__.py, docs/design.md "Layers") hold: `lint-imports` checks
.importlinter's contracts (a layer imports only the layers below it; the roles never each other),
and the service images' dependencies carry no plotting or load-testing library."""

from __future__ import annotations

import pathlib
import shutil
import subprocess
import sys

import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_layer_imports_only_the_layers_below_it():
    lint = shutil.which("lint-imports") or str(pathlib.Path(sys.executable).with_name("lint-imports"))
    proc = subprocess.run([lint, "--config", str(ROOT / ".importlinter")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "2 kept, 0 broken" in proc.stdout


def test_a_service_installs_no_plotting_or_load_testing_library():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {dep.split("=")[0].split(">")[0].split("[")[0].strip().lower() for dep in project["dependencies"]}
    assert not names & {"matplotlib", "locust", "ray"}
    assert any(dep.startswith("matplotlib") for dep in project["optional-dependencies"]["bench"])
