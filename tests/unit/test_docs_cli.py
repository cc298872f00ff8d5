"""Every command line the documentation shows exists.

README.md, BENCHMARKS.md, docs/*.md and notebooks/README.md name `dispatch ...` command lines
and `python -m dispatch.X --flag` commands, in fenced shell blocks and in inline code. A
reader copies them: each `dispatch` subcommand and flag must exist in the CLI the entry point
runs (the click command tree of `dispatch.cli.app`), each flag a pass-through command
(`dispatch chaos`, `dispatch streaming`) hands on must exist in the module it runs, and each
`python -m` module must exist, with the flags its argparse parser lists (`--help`, run once
per module, in one subprocess). Every miss is reported at once, with file:line.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from dispatch import cli

ROOT = Path(__file__).resolve().parents[2]
HELP_TIMEOUT_S = 120.0

SHELL_FENCES = {"", "bash", "sh", "shell", "console", "zsh", "text"}
"""Fenced blocks read as command lines (a ```python or ```json block is not)."""

SHELL_OPERATORS = {"|", "||", "&", "&&", ";", ";;", "(", ")", ">", ">>", "<", "<<", "2>", "#"}
PASS_THROUGH = re.compile(r"pass through to `python -m (dispatch(?:\.\w+)+)`")
"""How a command that hands its options on to a module says so in its help."""
FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w-]*)")
PYTHON_M = re.compile(r"(?:^|[\s/(`])python[\d.]*\s+-m\s+(dispatch(?:\.\w+)+)([^`\n]*)")


def doc_files() -> list[Path]:
    files = [ROOT / "README.md", ROOT / "BENCHMARKS.md", ROOT / "notebooks" / "README.md"]
    files += sorted((ROOT / "docs").glob("*.md"))
    return [path for path in files if path.exists()]


@dataclass(frozen=True)
class Snippet:
    """One command-line candidate: a line of a shell block, or an inline code span."""

    where: str  # file:line
    text: str


def snippets(path: Path, root: Path = ROOT) -> Iterator[Snippet]:
    """The lines of shell fences and the inline code spans outside fences (a span may wrap
    onto the next line, as Markdown allows)."""
    name = path.relative_to(root).as_posix()
    lines = path.read_text(encoding="utf-8").splitlines()
    prose: list[tuple[int, str]] = []
    fence: str | None = None
    continued: tuple[int, str] | None = None  # a shell line ending in a backslash, so far
    for number, line in enumerate(lines, start=1):
        stripped = line.strip()
        if stripped.startswith("```"):
            fence = stripped[3:].strip().lower() if fence is None else None
            continue
        if fence is None:
            prose.append((number, line))
        elif fence in SHELL_FENCES:
            start, text = continued if continued else (number, "")
            text += line
            if text.endswith("\\"):
                continued = (start, text[:-1] + " ")
                continue
            continued = None
            yield Snippet(f"{name}:{start}", text)
    # Inline code: paragraphs of consecutive prose lines, so a span may cross a line break.
    paragraph: list[tuple[int, str]] = []
    for entry in [*prose, (0, "")]:
        if entry[1].strip() and entry[0] == (paragraph[-1][0] + 1 if paragraph else entry[0]):
            paragraph.append(entry)
            continue
        yield from _inline_spans(name, paragraph)
        paragraph = [entry] if entry[1].strip() else []


def _inline_spans(name: str, paragraph: list[tuple[int, str]]) -> Iterator[Snippet]:
    if not paragraph:
        return
    text = "\n".join(line for _, line in paragraph)
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", text):
        line = paragraph[0][0] + text.count("\n", 0, match.start())
        yield Snippet(f"{name}:{line}", match.group(1).replace("\n", " "))


def tokens(text: str) -> list[str]:
    """A command line's words, shell operators apart. Markdown escapes (`\\|` in a table)
    are read as the alternative they stand for; brackets of optional parts are dropped."""
    text = text.replace("\\|", "/")
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|()<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        words = list(lexer)
    except ValueError:  # an unbalanced quote in prose: plain words will do
        words = text.split()
    return [word.strip("[]") for word in words if word.strip("[]")]


# --- the `dispatch` CLI -------------------------------------------------------------------


# typer vendors its own click (typer._click): its classes are read by duck typing here, not
# by a private import.
Command = Any


@functools.cache
def dispatch_command() -> Command:
    """The click command tree the `dispatch` entry point runs (built once)."""
    return typer.main.get_command(cli.app)


def _subcommands(command: Command) -> dict[str, Command] | None:
    """A group's commands by name; None for a leaf command."""
    found = getattr(command, "commands", None)
    return found if isinstance(found, dict) else None


def _options(command: Command) -> dict[str, Any]:
    """Every option spelling of `command` (`--help` included), to its parameter."""
    found: dict[str, Any] = {}
    for param in command.get_params(typer.Context(command, info_name=command.name)):
        if param.param_type_name == "option":
            for name in [*param.opts, *param.secondary_opts]:
                found[name] = param
    return found


def _takes_value(param: Any) -> bool:
    return param.param_type_name == "option" and not param.is_flag and not param.count


def _pass_through_module(command: Command) -> str | None:
    """The module a command hands its unknown options to, from its help text."""
    if not command.context_settings.get("ignore_unknown_options"):
        return None
    match = PASS_THROUGH.search(" ".join((command.help or "").split()))
    return match.group(1) if match else None


def check_dispatch_line(words: list[str]) -> tuple[list[str], list[tuple[str, list[str]]]]:
    """Misses in one `dispatch ...` command line (the words after `dispatch`, up to a shell
    operator), and the (module, flags) that a pass-through command hands on."""
    misses: list[str] = []
    command = dispatch_command()
    path = ["dispatch"]
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word in SHELL_OPERATORS or word.startswith(("$", "`")):
            break
        module = _pass_through_module(command)
        if module is not None:
            return misses, [(module, [w for w in words[index - 1 :] if FLAG.fullmatch(w)])]
        if word.startswith("-") and len(word) > 1 and not word[1:2].isdigit():
            flag = word.split("=", 1)[0]
            param = _options(command).get(flag)
            if param is None:
                misses.append(f"`{' '.join(path)}` has no option {flag}")
            elif _takes_value(param) and "=" not in word:
                index += 1  # its value
            continue
        commands = _subcommands(command)
        if commands is not None:
            sub = commands.get(word)
            if sub is None:
                misses.append(f"`{' '.join(path)}` has no command {word!r}")
                break
            command = sub
            path.append(word)
        # A leaf's other words are its arguments (or placeholders: ID, EXEC, ...).
    return misses, []


WRAPPERS = {"sudo", "time", "exec", "nohup", "env", "xargs", "watch", "$"}
"""Words after which the next word is still the command run."""


def _command_position(words: list[str], index: int) -> bool:
    """Whether words[index] is the program a command line runs (not an argument or a word of
    program output): the line's first word, or after a shell operator, an environment
    assignment, a wrapper (`xargs -n1`, `sudo`), or inside `docker compose run/exec`."""
    segment_start = max(
        (at + 1 for at, word in enumerate(words[:index]) if word in SHELL_OPERATORS), default=0
    )
    if "docker" in words[segment_start:index]:
        return True
    for before in reversed(words[segment_start:index]):
        if before in WRAPPERS or re.fullmatch(r"[A-Za-z_]\w*=\S*", before):
            continue
        if before.startswith("-") and "xargs" in words[:index]:
            continue
        return False
    return True


def dispatch_lines(words: list[str]) -> Iterator[list[str]]:
    """The words after each `dispatch` (or `.venv/bin/dispatch`) run in a command line."""
    for index, word in enumerate(words):
        if word != "dispatch" and not word.endswith("bin/dispatch"):
            continue
        if not _command_position(words, index):
            continue
        rest = words[index + 1 :]
        if rest:
            yield rest


# --- python -m modules ------------------------------------------------------------------


@functools.cache
def module_exists(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _argparse_module(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    origin = spec.origin if spec is not None else None
    if origin is None or not origin.endswith(".py"):
        return False
    return "ArgumentParser(" in Path(origin).read_text(encoding="utf-8")


HELP_SCRIPT = """
import contextlib, io, json, runpy, sys
found = {}
for module in sys.argv[1:]:
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [module, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = None
    except SystemExit as stop:
        code = stop.code
    except Exception as error:
        code = repr(error)
    found[module] = [code, out.getvalue(), err.getvalue()[-300:]]
print(json.dumps(found))
"""
"""Runs each module as `python -m module --help` would, all in one process: the modules share
their heavy imports (pyspark, Kafka clients), so this takes a quarter of the time of a
process per module."""


def module_flags(modules: set[str]) -> dict[str, set[str] | str]:
    """Each argparse module's flags, from its `--help`, or why they could not be read."""
    readable = sorted(module for module in modules if _argparse_module(module))
    if not readable:
        return {}
    command = [sys.executable, "-c", HELP_SCRIPT, *readable]
    try:
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=HELP_TIMEOUT_S, cwd=ROOT, check=True
        )
    except subprocess.TimeoutExpired:
        return dict.fromkeys(readable, f"`--help` of {readable} took over {HELP_TIMEOUT_S:g} s")
    flags: dict[str, set[str] | str] = {}
    for module, (code, out, err) in json.loads(done.stdout).items():
        if code not in (0, None):
            flags[module] = f"`python -m {module} --help` exited {code}: {err}"
        else:
            flags[module] = set(FLAG.findall(out))
    return flags


def python_m_commands(text: str) -> Iterator[tuple[str, list[str]]]:
    """(module, flags) of each `python -m dispatch.X ...` in a line."""
    for match in PYTHON_M.finditer(text):
        words: list[str] = []
        for word in tokens(match.group(2)):
            if word in SHELL_OPERATORS:
                break
            words.append(word)
        yield match.group(1), [word for word in words if FLAG.fullmatch(word)]


# --- the test ---------------------------------------------------------------------------


def doc_misses() -> list[str]:
    misses: list[str] = []
    wanted: list[tuple[str, str, list[str]]] = []  # (where, module, flags)
    for path in doc_files():
        for snippet in snippets(path):
            for module, flags in python_m_commands(snippet.text):
                wanted.append((snippet.where, module, flags))
            if "dispatch" not in snippet.text:
                continue
            for words in dispatch_lines(tokens(snippet.text)):
                found, handed_on = check_dispatch_line(words)
                misses += [f"{snippet.where}: {miss}" for miss in found]
                wanted += [(snippet.where, module, flags) for module, flags in handed_on]
    for where, module, _ in wanted:
        if not module_exists(module):
            misses.append(f"{where}: no module {module} (`python -m {module}`)")
    flags_of = module_flags(
        {module for _, module, flags in wanted if flags and module_exists(module)}
    )
    for where, module, flags in wanted:
        known = flags_of.get(module)
        if isinstance(known, str):
            misses.append(f"{where}: {known}")
            continue
        for flag in flags:
            name = flag.split("=", 1)[0]
            if known is not None and name not in known:
                misses.append(f"{where}: `python -m {module}` has no option {name}")
    return sorted(set(misses), key=_by_place)


def _by_place(miss: str) -> tuple[str, int, str]:
    place, _, what = miss.partition(": ")
    file, _, line = place.partition(":")
    return file, int(line) if line.isdigit() else 0, what


def test_every_documented_command_and_flag_exists() -> None:
    misses = doc_misses()
    assert not misses, f"{len(misses)} command lines in the docs do not exist:\n" + "\n".join(
        misses
    )


# --- the checker itself -------------------------------------------------------------------


def test_the_checker_finds_a_wrong_command_flag_and_module() -> None:
    assert check_dispatch_line(["submit", "demo.echo", "--wait", "--timeout", "5"]) == ([], [])
    assert check_dispatch_line(tokens("dlq list [--exec E] [--limit N] --json | jq .")) == (
        [],
        [],
    )
    assert check_dispatch_line(tokens("worker --app m:app --transport ws\\|rest --grace 3")) == (
        [],
        [],
    )
    assert check_dispatch_line(["submitt", "x"])[0] == ["`dispatch` has no command 'submitt'"]
    assert check_dispatch_line(["dlq", "list", "--nope"])[0] == [
        "`dispatch dlq list` has no option --nope"
    ]
    assert check_dispatch_line(["chaos", "--faults", "leader", "--seed", "1"]) == (
        [],
        [("dispatch.bench.chaos", ["--faults", "--seed"])],
    )
    assert list(python_m_commands(".venv/bin/python -m dispatch.bench.idle_bench --x 1 | y")) == [
        ("dispatch.bench.idle_bench", ["--x"])
    ]
    assert not module_exists("dispatch.bench.no_such_bench")
    flags = module_flags({"dispatch.streaming.class_training", "dispatch.client"})
    assert list(flags) == ["dispatch.streaming.class_training"]  # the client has no parser
    assert "--force" in flags["dispatch.streaming.class_training"]
    assert list(dispatch_lines(tokens("pip install dispatch"))) == []
    assert list(dispatch_lines(tokens("┃ measure ┃ dispatch ┃ Celery ┃"))) == []
    assert list(dispatch_lines(tokens("A=1 .venv/bin/dispatch up --detach"))) == [
        ["up", "--detach"]
    ]
    assert list(dispatch_lines(tokens("x --json | xargs -n1 dispatch dlq redrive"))) == [
        ["dlq", "redrive"]
    ]
    assert list(dispatch_lines(tokens("docker compose run --rm -T keys dispatch keys"))) == [
        ["keys"]
    ]


def test_inline_code_may_wrap_and_fences_other_than_shell_are_skipped(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Run `dispatch keys --role\nworker` first.\n\n```python\ndispatch nothing\n```\n"
        "```bash\ndispatch up \\\n  --detach\n```\n",
        encoding="utf-8",
    )
    found = [(snippet.where, snippet.text) for snippet in snippets(page, tmp_path)]
    assert found == [
        ("page.md:8", "dispatch up    --detach"),
        ("page.md:1", "dispatch keys --role worker"),
    ]


INTERNAL_ISSUE = re.compile(r"\bissues? #?\d+\b", re.IGNORECASE)
USER_FACING = ("*.md", "*.py", "*.ipynb", "*.toml", "*.sh", "Dockerfile", "docker-compose.yml")


def test_no_user_facing_text_cites_an_internal_issue_number() -> None:
    """Docs, help texts, docstrings and messages speak for themselves: a reader has no access to
    the project's issue tracker, so "(issue 13)" tells them nothing. The tests may cite them."""
    tracked = subprocess.run(
        ["git", "ls-files", "--", *USER_FACING],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    found = [
        f"{name}:{number}: {line.strip()[:120]}"
        for name in tracked
        if not name.startswith("tests/")
        for number, line in enumerate((ROOT / name).read_text().splitlines(), 1)
        if INTERNAL_ISSUE.search(line)
    ]
    assert found == []
