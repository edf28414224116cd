r"""Execute the tutorial notebooks top to bottom.

``python tutorials/run_notebooks.py`` (what ``make tutorials`` runs) executes every
notebook in this folder with its full settings and writes it back with its outputs, so
the stored notebooks read well on a code host without running them.
Figures are stored with a 256-colour palette (:func:`compress_figures`).
``--quick`` sets ``STREAMGP_TUTORIAL_QUICK=1`` for the kernel (each notebook then shortens
its loops; the test suite executes the notebooks this way) and, unless ``--write`` is
given, leaves the stored files untouched.

Usage: ``python tutorials/run_notebooks.py [--quick] [--write] [NOTEBOOK ...]``
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
#: The environment variable a notebook reads to shorten its loops (CI's quick mode).
QUICK_ENV = "STREAMGP_TUTORIAL_QUICK"


def notebooks() -> list[Path]:
    r"""Every tutorial notebook, in name order."""
    return sorted(HERE.glob("*.ipynb"))


def execute_notebook(path: Path, quick: bool, write: bool, timeout: int = 1200):
    r"""Run ``path`` top to bottom in a fresh kernel (working directory: this folder).

    A failing cell raises ``nbclient.exceptions.CellExecutionError`` naming the cell.
    Returns the executed notebook (written back to ``path`` when ``write``).
    """
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    previous = os.environ.get(QUICK_ENV)
    os.environ[QUICK_ENV] = "1" if quick else "0"
    try:
        client = NotebookClient(
            notebook,
            timeout=timeout,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        )
        client.execute()
    finally:
        if previous is None:
            os.environ.pop(QUICK_ENV, None)
        else:
            os.environ[QUICK_ENV] = previous
    if write:
        compress_figures(notebook)
        nbformat.write(notebook, path)
    return notebook


def compress_figures(notebook) -> None:
    r"""Store each PNG output with a 256-colour palette where that saves a fifth or more.

    The maps (dense colour fields) shrink about 3x; line plots barely change. Keeps the
    stored tutorials small (issue 41: under 3 MB together).
    """
    import base64
    import io

    from PIL import Image

    for cell in notebook.cells:
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if "image/png" not in data:
                continue
            image = Image.open(io.BytesIO(base64.b64decode(data["image/png"]))).convert("RGB")
            buffer = io.BytesIO()
            image.quantize(colors=256).save(buffer, format="PNG", optimize=True)
            compressed = base64.b64encode(buffer.getvalue()).decode()
            if len(compressed) < 0.8 * len(data["image/png"]):
                data["image/png"] = compressed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="*", type=Path, help="default: every notebook here")
    parser.add_argument("--quick", action="store_true", help=f"set {QUICK_ENV}=1")
    parser.add_argument("--write", action="store_true", help="store outputs of a quick run too")
    args = parser.parse_args()
    for path in args.paths or notebooks():
        start = time.perf_counter()
        execute_notebook(path.resolve(), args.quick, write=args.write or not args.quick)
        print(f"{path.name}: {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
