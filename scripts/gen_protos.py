"""Generate the Python stubs of protos/ into specpipe/v1/ (the only source of generated code).

    python scripts/gen_protos.py          # regenerate
    python scripts/gen_protos.py --check  # CI: fail if the committed stubs differ
"""

import argparse
import filecmp
import pathlib
import shutil
import sys
import tempfile

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parents[1]
PROTOS = ROOT / "protos"
OUT = ROOT / "specpipe" / "v1"


def generate(out_root: pathlib.Path) -> list[pathlib.Path]:
    files = sorted(PROTOS.glob("specpipe/v1/*.proto"))
    include = pathlib.Path(protoc.__file__).parent / "_proto"
    args = ["protoc", f"-I{PROTOS}", f"-I{include}", f"--python_out={out_root}",
            f"--pyi_out={out_root}", f"--grpc_python_out={out_root}"]
    if protoc.main(args + [str(f.relative_to(PROTOS)) for f in files]) != 0:
        sys.exit("protoc failed")
    return sorted((out_root / "specpipe" / "v1").glob("*_pb2*.py*"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generated = generate(pathlib.Path(tmp))
        if args.check:
            stale = [
                g.name
                for g in generated
                if not (OUT / g.name).exists() or not filecmp.cmp(g, OUT / g.name, shallow=False)
            ]
            if stale:
                sys.exit(f"generated stubs are stale, run scripts/gen_protos.py: {stale}")
            print(f"{len(generated)} generated stubs are up to date")
            return
        OUT.mkdir(parents=True, exist_ok=True)
        for g in generated:
            shutil.copy(g, OUT / g.name)
        (OUT / "__init__.py").touch()
        print(f"wrote {len(generated)} stubs to {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
