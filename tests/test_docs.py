"""The docs hold to the code and to their kinds: reference pages (docs/*.md, the README) say how the
system works now, without dates or host names except inside links to records; each record is a dated
page of docs/results/ with one line in its index; each reference page names the code it describes
(scripts/docs_for.py), and every source file has such a page; links resolve; the README stays short
and names where the models come from."""

from __future__ import annotations

import importlib.util
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RESULTS = DOCS / "results"
REFERENCE = sorted(DOCS.glob("*.md")) + [ROOT / "README.md"]
DATE = re.compile(r"\b20\d\d-\d\d-\d\d\b")
HOSTS = re.compile(r"\b(Xeon|EPYC|Ryzen|Threadripper|Zen ?\d|Sapphire Rapids|Ice Lake|Graviton|Ampere Altra|"
                   r"[AH]100|H200|L40S?|RTX ?\d+)\b")
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
RECORD = re.compile(r"^(20\d\d-\d\d-\d\d)-[a-z0-9-]+\.md$")


def docs_for():
    spec = importlib.util.spec_from_file_location("docs_for", ROOT / "scripts" / "docs_for.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outside_record_links(text: str) -> str:
    """The text with every link to a record (docs/results/...) left out, its words included."""
    return LINK.sub(lambda m: "" if "results/" in m.group(2) else m.group(0), text)


@pytest.mark.parametrize("page", REFERENCE, ids=lambda p: p.name)
def test_reference_pages_carry_no_dates_or_host_names(page):
    text = outside_record_links(page.read_text())
    found = [m.group(0) for m in (*DATE.finditer(text), *HOSTS.finditer(text))]
    assert not found, f"{page.name} names {found}: say it in a dated record and link to it"


def test_each_record_is_a_dated_page_with_one_line_in_the_index():
    index = (RESULTS / "README.md").read_text()
    rows = [line for line in index.splitlines() if line.startswith("| 20")]
    linked = [LINK.findall(row)[-1][1] for row in rows]
    pages = sorted(p.name for p in RESULTS.glob("*.md") if p.name != "README.md")
    assert all(RECORD.match(name) for name in pages), [n for n in pages if not RECORD.match(n)]
    assert sorted(linked) == pages  # every record once, nothing else
    for row, target in zip(rows, linked):
        cells = [cell.strip() for cell in row.strip("|").split("|")]
        assert len(cells) == 4 and all(cells), row  # date, question, answer, record
        assert cells[0] == RECORD.match(target).group(1), row
    dates = [row.split("|")[1].strip() for row in rows]
    assert dates == sorted(dates, reverse=True)  # newest first


def test_every_reference_page_describes_code_and_all_code_is_described():
    module = docs_for()
    table = module.described()
    assert all(table.values()), [doc for doc, owned in table.items() if not owned]
    missing = [path for owned in table.values() for path in owned if not (ROOT / path).exists()]
    assert not missing
    sources = [str(p.relative_to(ROOT)) for pattern in ("specpipe/**/*.py", "*_service/**/*.py",
                                                        "orchestrator/**/*.py", "scripts/*.py", "deploy/**/*.py")
               for p in ROOT.glob(pattern) if "_pb2" not in p.name]
    undescribed = [path for path, docs in module.docs_for(sources).items() if not docs]
    assert not undescribed, f"no doc describes {undescribed}: add them to a docs/*.md describes line"


def test_links_between_docs_resolve():
    broken = []
    for page in [*REFERENCE, *RESULTS.glob("*.md")]:
        for _, target in LINK.findall(page.read_text()):
            path = target.split("#")[0]
            if path and "://" not in path and not path.startswith("mailto:"):
                if not (page.parent / path).exists():
                    broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken


def test_the_readme_is_short_and_names_the_model_sources():
    from specpipe.models.packaged import PACKAGED

    assert len((ROOT / "README.md").read_text().splitlines()) <= 150
    design = (DOCS / "design.md").read_text()
    for model in PACKAGED.values():
        stems = {requirement.split("==")[0].rsplit("-part", 1)[0] for requirement in model.requirements}
        assert all(stem in design for stem in stems) and model.sha256 in design, model.name
