"""The book's chapter "From Python and PyTorch" (book/src/python.md): its Python blocks run in
order, in one namespace, from the repository root, so the page and the package cannot
disagree."""

import os
import pathlib
import re

from conftest import need

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_chapters_examples_run():
    need("fusebox")
    need("torch")
    text = (ROOT / "book/src/python.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 6, "the chapter's examples"
    namespace = {}
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        for k, block in enumerate(blocks):
            exec(compile(block, f"book/src/python.md block {k + 1}", "exec"), namespace)
    finally:
        os.chdir(cwd)
