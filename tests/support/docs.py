"""The user's guide as tests read it: a section of a docs/ page (or README.md) and its fenced
examples, so a test runs the text a user copies, from the page that now holds it."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent


def doc_text(page: str) -> str:
    """A page by its path from the repository's root: `docs/mcp.md`, `README.md`."""
    return (ROOT / page).read_text()


def doc_section(page: str, heading: str) -> str:
    """The `## ` section of `page` whose heading starts with `heading`, up to the next `## `."""
    text = doc_text(page)
    match = re.search(rf"^## {re.escape(heading)}.*$", text, flags=re.M)
    assert match, f"{page} has no section '## {heading}'"
    end = re.search(r"^## ", text[match.end():], flags=re.M)
    return text[match.start():match.end() + end.start() if end else len(text)]


def fenced(section: str, language: str) -> list[str]:
    """The bodies of the section's ```<language> blocks, in order."""
    return re.findall(rf"^```{language}\n(.*?)^```$", section, flags=re.M | re.S)


def pip_lines(section: str) -> list[str]:
    """The `pip install ...` lines of a section, in bash blocks or inline code."""
    in_blocks = [line for block in fenced(section, "bash") for line in block.splitlines()
                 if line.startswith("pip install ")]
    inline = re.findall(r"`(pip install [^`]+)`", section)
    return in_blocks + inline


def shell_commands(block: str) -> list[str]:
    """The commands of a bash block, as written: a command ends where its quotes close and no `\\`
    continues it (a quoted JSON body may span lines); lines of `#` alone (the output a command shows)
    are left out."""
    commands: list[str] = []
    pending: list[str] = []
    for line in block.splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending.append(line)
        text = "\n".join(pending)
        if not text.rstrip().endswith("\\") and _complete(text):
            commands.append(text)
            pending = []
    assert not pending, f"an unfinished command in the block: {pending}"
    return commands


def _complete(text: str) -> bool:
    try:
        shlex.split(text, comments=True)
    except ValueError:  # a quote still open
        return False
    return True


def user_env(**extra: str) -> dict[str, str]:
    """The environment of a user's shell running the docs' lines: none of the test run's paywire
    or Python settings, plus `extra`."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PAYWIRE_", "PYTHON", "VIRTUAL_ENV"))}
    return {**clean, **extra}


# The client pip lines the fresh-virtualenv tests install (tests/test_doc_snippets.py), by page and
# section; `make` downloads their wheels into WHEELHOUSE (`python -m tests.support.docs`).
FRESH_VENV_SECTIONS = (("docs/mcp.md", "Use it from MCP"), ("docs/discovery.md", "Find it: OpenAPI"),
                       ("docs/models.md", "Models"))
WHEELHOUSE = ROOT / ".wheelhouse"


def pip_arguments(line: str) -> str:
    """What follows `pip install ` on a docs line, quoted as the docs quote it."""
    return line.removeprefix("pip install ").strip()




def fresh_venv(where: Path, pip_line: str) -> Path:
    """A new virtualenv at `where` with `pip_line` (the docs' text, verbatim) installed offline
    from the wheelhouse; its python."""
    import pytest  # (lazily: `make` runs this module to list the pip lines)
    if not WHEELHOUSE.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no wheelhouse at {WHEELHOUSE}: `make test` downloads it")
        pytest.skip(f"no wheelhouse at {WHEELHOUSE}: run `make test` (or `make lint`) once to fill it")
    # The venv's own pip would be this interpreter's ensurepip copy: the same pip, run for the
    # venv through `--python` instead of installed into it first (~3 s a venv). `--no-compile`: the
    # snippet compiles what it imports; compiling every installed file up front is ~3 s more.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True,
                   timeout=120)
    python = where / "bin" / "python"
    args = shlex.split(pip_line)
    assert args[:2] == ["pip", "install"], pip_line
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "--disable-pip-version-check", "-q",
         *args[1:], "--no-compile", "--no-index", "--find-links", str(WHEELHOUSE)],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, f"`{pip_line}` failed offline:\n{done.stderr}"
    return python


if __name__ == "__main__":
    for page, heading in FRESH_VENV_SECTIONS:
        print(pip_arguments(pip_lines(doc_section(page, heading))[0]))
