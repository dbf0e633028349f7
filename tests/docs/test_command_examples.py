"""The docs stay true to the code: every `hetprof …` example in a fenced shell block of README.md and
docs/**/*.md parses against the real click command tree, every name a fenced Python example imports
exists, every relative link in README.md reaches a file (and heading), and docs/results.md is what
`make results` writes.

Parsing resolves the subcommand chain and makes each command's context from the example's words with
the command's own parameters — names, flags, counts, choices and value types — so a renamed or
removed option, a misspelt subcommand or a wrong choice fails here. Nothing runs: parameter callbacks
are held back while parsing, and paths are only arguments (placeholders such as PLAN.json need not
exist). Other failures (a missing required option, a value of the wrong type) fail as they would in
a shell.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import importlib
import re
import shlex
import subprocess
import sys
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from hetprof.cli import cli

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL_LANGS = {"bash", "sh", "shell", "console", "zsh"}
SEPARATORS = {"&&", "||", ";", "|", "&"}
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<lang>[\w-]*).*$")


@dataclass(frozen=True)
class Example:
    page: Path
    line: int
    words: tuple[str, ...]  # after `hetprof`

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: hetprof {shlex.join(self.words)}"


def fenced_blocks(text: str) -> Iterator[tuple[str, int, list[str]]]:
    """(language, first line number, lines) of every fenced code block."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, start, body = m.group("fence"), i + 1, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        yield m.group("lang").lower(), start + 1, body
        i += 1


def shell_commands(body: list[str], first: int) -> Iterator[tuple[int, list[str]]]:
    """(line number, words) of each simple command in a shell block: continuations joined, comments
    dropped, split at `&&`, `||`, `;`, `|` and `&`."""
    logical: list[tuple[int, str]] = []
    pending, start = "", first
    for k, raw in enumerate(body):
        line = raw.rstrip()
        if not pending:
            start = first + k
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append((start, pending + line))
        pending = ""
    if pending:
        logical.append((start, pending))
    for number, line in logical:
        lexer = shlex.shlex(line.lstrip("$ "), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        segment: list[str] = []
        for word in [*lexer, ";"]:
            if word in SEPARATORS:
                if segment:
                    yield number, segment
                segment = []
            else:
                segment.append(word)


def examples() -> list[Example]:
    found = []
    for page in PAGES:
        for lang, first, body in fenced_blocks(page.read_text(encoding="utf-8")):
            if lang not in SHELL_LANGS:
                continue
            for number, words in shell_commands(body, first):
                while words and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*=.*", words[0]):
                    words = words[1:]  # VAR=value prefixes
                if words and Path(words[0]).name == "hetprof":
                    found.append(Example(page, number, tuple(words[1:])))
    return found


EXAMPLES = examples()


@contextlib.contextmanager
def parse_only(command: click.Command) -> Iterator[None]:
    """While parsing: no parameter callbacks (they read databases and files), and paths not required
    to exist. The command's parameters are restored afterwards."""
    saved = [(p, p.callback, p.type) for p in command.params]
    try:
        for p in command.params:
            p.callback = None
            if isinstance(p.type, click.Path) and p.type.exists:
                p.type = copy.copy(p.type)
                p.type.exists = False
        yield
    finally:
        for p, callback, kind in saved:
            p.callback, p.type = callback, kind


def parse(words: tuple[str, ...] | list[str]) -> list[str]:
    """Parse `hetprof WORDS` down the real command tree; the chain of command names it resolved.
    Raises click's usage errors for anything a shell would be refused."""
    command: click.Command = cli
    name, args, parent, chain = "hetprof", list(words), None, []
    while True:
        with parse_only(command):
            ctx = command.make_context(name, args, parent=parent)
        chain.append(name)
        if not isinstance(command, click.Group):
            return chain
        rest = [*getattr(ctx, "_protected_args", []), *ctx.args]
        if not rest:
            return chain
        name, command, args = command.resolve_command(ctx, rest)
        parent = ctx


def test_the_examples_are_found_on_every_command_page():
    """The extractor must see the examples: each command's guide page holds some of its own."""
    by_page: dict[str, set[str]] = {}
    for ex in EXAMPLES:
        first = next((w for w in ex.words if not w.startswith("-") and w not in {"demo-out/profiles.db"}), "")
        by_page.setdefault(ex.page.name, set()).add(first)
    for command in ("profile", "db", "fit", "plan", "run", "validate"):
        assert command in by_page.get(f"{command}.md", set()), f"no `hetprof {command}` example found in {command}.md"
    assert {"profile", "db", "fit", "plan", "run", "validate"} <= by_page["README.md"]


@pytest.mark.parametrize("example", EXAMPLES, ids=str)
def test_each_example_parses(example: Example):
    try:
        parse(example.words)
    except click.ClickException as exc:
        pytest.fail(f"{example}\n  does not parse: {exc.format_message()}")


@pytest.mark.parametrize("words", [
    ("plan", "-c", "C.yaml", "-w", "W.yaml", "--max-evalz", "20"),       # a renamed option
    ("plan", "-c", "C.yaml", "-w", "W.yaml", "--objective", "speed"),    # a choice that is not one
    ("plann", "-c", "C.yaml"),                                           # a misspelt subcommand
    ("db", "shw", "3fa2c1"),                                             # ... in a group
    ("run", "plan.json", "--iterations", "many"),                        # a value of the wrong type
    ("plan", "-w", "W.yaml"),                                            # a required option left out
])
def test_a_broken_example_fails(words):
    with pytest.raises(click.ClickException):
        parse(words)


def test_parsing_runs_nothing_and_restores_the_commands(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert parse(("--db", "nowhere.db", "validate", "missing.jsonl")) == ["hetprof", "validate"]
    assert not (tmp_path / "nowhere.db").exists()
    run = cli.get_command(click.Context(cli), "run")
    plan_arg = next(p for p in run.params if p.name == "plan")
    assert plan_arg.type.exists  # the real command still checks its plan file


# ---- Python examples ----------------------------------------------------------------------------

def python_imports() -> list[tuple[str, str, str]]:
    """(where, module, name) for every `from hetprof… import name` of a fenced Python example."""
    found = []
    for page in PAGES:
        for lang, first, body in fenced_blocks(page.read_text(encoding="utf-8")):
            if lang not in {"python", "py"}:
                continue
            for k, line in enumerate(body):  # line by line: some blocks are signatures, not programs
                if not re.match(r"\s*from hetprof[\w.]* import ", line):
                    continue
                node = ast.parse(line.strip()).body[0]
                where = f"{page.relative_to(ROOT)}:{first + k}"
                found += [(where, node.module, alias.name) for alias in node.names]
    return found


IMPORTS = python_imports()


def test_python_examples_are_found():
    assert len({where.split(":")[0] for where, _, _ in IMPORTS}) >= 2


@pytest.mark.parametrize(("where", "module", "name"), IMPORTS, ids=[f"{w} {m}.{n}" for w, m, n in IMPORTS])
def test_each_python_example_import_exists(where, module, name):
    """A moved or renamed module or class fails here, naming the page and line that still use it."""
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        pytest.fail(f"{where}: from {module} import {name}: {exc}")
    assert hasattr(imported, name), f"{where}: {module} has no {name}"


# ---- links --------------------------------------------------------------------------------------

def slug(heading: str) -> str:
    """Python-Markdown's toc slug (what MkDocs and the README's anchors use)."""
    text = re.sub(r"`|\*\*|\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    text = page.read_text(encoding="utf-8")
    in_code = {n for _, first, body in fenced_blocks(text) for n in range(first - 1, first + len(body) + 1)}
    return {slug(m.group(1)) for n, line in enumerate(text.splitlines(), 1)
            if n not in in_code and (m := re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line))}


def relative_links(page: Path) -> list[str]:
    """Markdown link targets outside code and HTML comments, other than web addresses."""
    text = re.sub(r"<!--.*?-->", "", page.read_text(encoding="utf-8"), flags=re.S)
    text = re.sub(r"^ *```.*?^ *```", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", text)
    return [t for t in targets if not re.match(r"[a-z][a-z0-9+.-]*:", t)]


def test_every_relative_link_in_the_readme_resolves():
    readme = ROOT / "README.md"
    links = relative_links(readme)
    assert links, "the README links into the guide"
    broken = []
    for target in links:
        path, _, anchor = target.partition("#")
        file = (readme.parent / path).resolve() if path else readme
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, "README.md has broken links:\n" + "\n".join(broken)


def test_a_broken_link_is_seen(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](docs/nowhere.md) `[b](x.md)` [c](https://example.org)\n<!-- [d](gone.md) -->\n")
    assert relative_links(page) == ["docs/nowhere.md"]


# ---- the generated results page -----------------------------------------------------------------

def test_the_results_page_is_what_its_command_writes(tmp_path):
    """docs/results.md is generated (`make results`), never edited: regenerating it changes nothing
    but the commit its header names."""
    out = tmp_path / "results.md"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "results_page.py"), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr

    def body(text: str) -> list[str]:
        return [line for line in text.splitlines() if "commit" not in line]

    committed = (ROOT / "docs" / "results.md").read_text(encoding="utf-8")
    assert committed.startswith("<!-- GENERATED by `make results`")
    assert body(out.read_text(encoding="utf-8")) == body(committed), (
        "docs/results.md is stale or was edited by hand: run `make results` and commit it")
