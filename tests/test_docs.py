"""README.md and the documentation pages (docs/): links resolve, every Python block runs.

Every block fenced as ``python`` in README.md and docs/**/*.md is executed as written, in a
fresh namespace, from a temporary working directory (so that files it writes go nowhere), with
a fixed torch seed. Blocks that are not meant to run are fenced otherwise (``bash``, ``text``).
A block that needs an optional extra (Ax, Dask) is skipped when the extra is missing; CI
installs them all. Models a block registers are unregistered afterwards.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch

from streamgp.models import registered_models, unregister_model

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").rglob("*.md"))]
OPTIONAL_EXTRAS = {"ax", "dask", "distributed"}
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def code_blocks(path: Path) -> list[tuple[int, str, str]]:
    r"""``(line, language, code)`` for every fenced block of a Markdown file (dedented)."""
    blocks, lines, i = [], path.read_text(encoding="utf-8").split("\n"), 0
    while i < len(lines):
        match = re.match(r"^(\s*)```(\S*)", lines[i])
        if match is None:
            i += 1
            continue
        indent, language, start, body = len(match.group(1)), match.group(2), i + 1, []
        i += 1
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        blocks.append((start, language, "\n".join(body) + "\n"))
        i += 1
    return blocks


def python_blocks() -> list:
    params = []
    for page in PAGES:
        for line, language, code in code_blocks(page):
            if language == "python":
                name = f"{page.relative_to(ROOT)}:{line}"
                params.append(pytest.param(name, code, id=name))
    return params


def test_every_page_has_its_blocks_closed():
    for page in PAGES:
        fences = [ln for ln in page.read_text(encoding="utf-8").split("\n") if "```" in ln]
        assert len(fences) % 2 == 0, f"{page.relative_to(ROOT)} has an unclosed code fence"


def test_readme_relative_links_resolve():
    text = README.read_text(encoding="utf-8")
    targets = LINK.findall(text) + re.findall(r'<img[^>]+src="([^"]+)"', text)
    relative = [t for t in targets if not re.match(r"^[a-z][a-z0-9+.-]*:|^#", t)]
    assert relative, "README.md has no relative links to check"
    missing = [t for t in relative if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, f"README.md links to files that do not exist: {missing}"


def test_readme_is_a_landing_page():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 300


#: The committed benchmark results the docs quote (issue 41): summaries and figures only.
MAX_RESULTS_BYTES = 10 * 2**20


def test_benchmark_results_stay_small():
    # What git tracks (runs regenerated locally are ignored), or every file outside a clone.
    results = ROOT / "benchmarks" / "results"
    listed = subprocess.run(
        ["git", "ls-files", "-z", str(results)], cwd=ROOT, capture_output=True, text=True
    )
    if listed.returncode == 0 and listed.stdout:
        files = [ROOT / name for name in listed.stdout.split("\0") if name]
    else:
        files = [p for p in results.rglob("*") if p.is_file()]
    total = sum(p.stat().st_size for p in files if p.is_file())
    assert total <= MAX_RESULTS_BYTES, f"benchmarks/results holds {total / 2**20:.1f} MiB"


@pytest.mark.parametrize(("name", "code"), python_blocks())
def test_python_block_runs_as_written(name, code, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    models_before = set(registered_models())
    dtype = torch.get_default_dtype()
    torch.manual_seed(0)
    try:
        exec(compile(code, name, "exec"), {"__name__": "__docs__"})
    except ModuleNotFoundError as error:
        if (error.name or "").split(".")[0] in OPTIONAL_EXTRAS:
            pytest.skip(f"{name} needs an optional extra ({error.name})")
        raise
    finally:
        torch.set_default_dtype(dtype)
        for model in set(registered_models()) - models_before:
            unregister_model(model)
