"""The commands the documentation shows are ones that run.

Every ``hrwcron`` command in a code block of README.md or of a page under docs/ is parsed by the
real argument parser (``hrwcron.cli.build_parser``), with each option named in full: a renamed
or removed verb or flag, an option that lost its value, or a value its type refuses fails here,
as does one that only still works as an abbreviation of a longer flag. A synopsis line
(``hrwcron jobs ls [--prefix P] [--quiet]``, ``[--limit N | --all]``) is parsed without its
optional parts and with each of them in turn, a placeholder (``N``, ``JOB``) standing for a value
of the option's type. An ``hrwcron`` command quoted in running text only has its verbs and flags
checked, since text names parts of commands (``hrwcron apply``, ``--worker-group NAME``).
Every ``make`` command names targets and variables the Makefile has.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeAlias

import pytest

from hrwcron.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
SHELL_BLOCKS = {"", "sh", "bash", "shell", "console"}
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*(?:\.\.\.)?|\.\.\.|…)$")
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
OPERATORS = {";", "|", "&&", "||", "&"}
REDIRECTIONS = {">", ">>", "<", "2>", "2>&1"}
# Values tried, in order, for a placeholder of an option whose type is not a plain string.
SAMPLES = ("1", "2026-01-01T00:00:00Z", "1s", "UTC", "a")


def doc_files() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


# --- Extraction ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Word:
    text: str
    quoted: bool


@dataclass(frozen=True)
class Command:
    where: str  # file:line
    words: tuple[Word, ...]
    # From a code block (parsed in full) or from a code span in running text (names only).
    block: bool

    @property
    def program(self) -> str:
        return self.words[0].text

    def __str__(self) -> str:
        return " ".join(w.text for w in self.words)


def split_words(line: str) -> list[Word]:
    """Shell words of one line: quotes and backslashes as sh reads them, ``#`` at the start of a
    word begins a comment, and ``;``, ``|``, ``&&``, ``>`` and friends are words of their own."""
    words: list[Word] = []
    text: list[str] = []
    quoted = started = False
    i = 0

    def end() -> None:
        nonlocal text, quoted, started
        if started:
            words.append(Word("".join(text), quoted))
        text, quoted, started = [], False, False

    while i < len(line):
        c = line[i]
        if c in " \t":
            end()
        elif c == "#" and not started:
            break
        elif c in "'\"":
            close = line.find(c, i + 1)
            if close < 0:
                raise ValueError(f"unbalanced {c} in {line!r}")
            text.append(
                line[i + 1 : close].replace('\\"', '"') if c == '"' else line[i + 1 : close]
            )
            quoted = started = True
            i = close
        elif c == "\\" and i + 1 < len(line):
            text.append(line[i + 1])
            quoted = started = True
            i += 1
        elif c in ";|&<>" and not quoted:
            j = i + 1
            while j < len(line) and line[j] in "|&>":
                j += 1
            if "".join(text) == "2" and c == ">":  # 2> and 2>&1
                text, started = [], False
                words.append(Word("2" + line[i:j], False))
            else:
                end()
                words.append(Word(line[i:j], False))
            i = j - 1
        else:
            text.append(c)
            started = True
        i += 1
    end()
    return words


def segments(words: Sequence[Word]) -> Iterator[list[Word]]:
    """The simple commands of a line: split at ``;``, ``&&`` and pipes (a ``|`` inside the
    brackets of a synopsis separates alternatives instead), without redirections."""
    current: list[Word] = []
    depth = 0
    skip = False
    for word in words:
        if skip:
            skip = False
            continue
        if not word.quoted:
            depth += word.text.count("[") - word.text.count("]")
            if word.text in REDIRECTIONS:
                skip = word.text != "2>&1"
                continue
            if word.text in OPERATORS and not (word.text == "|" and depth > 0):
                yield current
                current = []
                continue
        current.append(word)
    yield current


def command_of(words: list[Word]) -> list[Word] | None:
    """The ``hrwcron`` or ``make`` command a simple command runs, past variable assignments."""
    while words and not words[0].quoted and ASSIGNMENT.match(words[0].text):
        words = words[1:]
    if words and not words[0].quoted and words[0].text.split("/")[-1] in ("hrwcron", "make"):
        return [Word(words[0].text.split("/")[-1], False), *words[1:]]
    return None


def extract(path: Path, text: str | None = None) -> list[Command]:
    """Every ``hrwcron`` and ``make`` command of one Markdown file."""
    if text is None:
        text = path.read_text()
    name = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
    commands: list[Command] = []
    lines = text.splitlines()
    prose: list[tuple[int, str]] = []
    i = 0
    while i < len(lines):
        fence = re.match(r"^\s*(```+|~~~+)\s*([\w-]*)", lines[i])
        if not fence:
            prose.append((i + 1, lines[i]))
            i += 1
            continue
        lang = fence.group(2)
        body: list[tuple[int, str]] = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence.group(1)):
            body.append((i + 1, lines[i]))
            i += 1
        i += 1
        if lang not in SHELL_BLOCKS:
            continue
        joined: list[tuple[int, str]] = []
        for number, line in body:
            if joined and joined[-1][1].endswith("\\"):
                joined[-1] = (joined[-1][0], joined[-1][1][:-1] + " " + line.strip())
            else:
                joined.append((number, line))
        prompted = any(line.startswith("$ ") for _, line in joined)
        for number, line in joined:
            if prompted:
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            for segment in segments(split_words(line.strip())):
                found = command_of(segment)
                if found:
                    commands.append(Command(f"{name}:{number}", tuple(found), block=True))
    # Code spans in running text; a span may wrap onto the next line of its paragraph.
    paragraph = "\n".join(line for _, line in prose)
    numbers = [n for n, _ in prose]
    for match in re.finditer(r"(?<!`)`([^`]+)`(?!`)", paragraph):
        span = " ".join(match.group(1).split())
        if not re.match(r"^(?:[A-Za-z_][A-Za-z0-9_]*=\S*\s+)*(?:hrwcron|make)\s+\S", span):
            continue
        line = numbers[paragraph.count("\n", 0, match.start())]
        for segment in segments(split_words(span)):
            found = command_of(segment)
            if found:
                commands.append(Command(f"{name}:{line}", tuple(found), block=False))
    return commands


def all_commands() -> list[Command]:
    return [command for path in doc_files() for command in extract(path)]


# --- Synopsis: optional parts and alternatives ---------------------------------------------------

Item: TypeAlias = "str | list[list[Item]]"  # a word, or a group: its alternatives


def bracket_tree(words: Sequence[Word]) -> list[Item]:
    """Words with the synopsis brackets of unquoted words made into groups of alternatives."""
    stack: list[list[list[Item]]] = [[[]]]
    for word in words:
        text = word.text
        if word.quoted:
            stack[-1][-1].append(text)
            continue
        while text.startswith("["):
            text = text[1:]
            stack.append([[]])
        closing = len(text) - len(text.rstrip("]"))
        text = text[: len(text) - closing]
        if text == "|" and len(stack) > 1:
            stack[-1].append([])
        elif text:
            stack[-1][-1].append(text)
        for _ in range(closing):
            if len(stack) == 1:
                raise ValueError(f"unbalanced ] in {' '.join(w.text for w in words)}")
            group = stack.pop()
            stack[-1][-1].append(group)
    if len(stack) != 1:
        raise ValueError(f"unbalanced [ in {' '.join(w.text for w in words)}")
    return stack[0][0]


def variants(items: Sequence[Item]) -> list[list[str]]:
    """The command without any optional part, then with each part (each alternative of it) in
    turn, the parts nested in it expanded the same way."""

    def bare(seq: Sequence[Item]) -> list[str]:
        return [item for item in seq if isinstance(item, str)]

    result = [bare(items)]
    for index, item in enumerate(items):
        if isinstance(item, str):
            continue
        for alternative in item:
            for inner in variants(alternative):
                before = bare(items[:index])
                after = bare(items[index + 1 :])
                result.append([*before, *inner, *after])
    unique: list[list[str]] = []
    for argv in result:
        if argv not in unique:
            unique.append(argv)
    return unique


# --- Checking against the parser ---------------------------------------------------------------


def _subparsers(parser: argparse.ArgumentParser) -> argparse._SubParsersAction[Any] | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return None


def chain(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[argparse.ArgumentParser]:
    """The parsers a command line goes through: the program's, then each verb's."""
    parsers = [parser]
    rest = list(argv)
    while (sub := _subparsers(parsers[-1])) is not None:
        verbs = [word for word in rest if not word.startswith("-")]
        if not verbs or verbs[0] not in sub.choices:
            known = ", ".join(sorted(sub.choices))
            raise LookupError(f"no verb {verbs[0] if verbs else '(none)'!r}; verbs: {known}")
        parsers.append(sub.choices[verbs[0]])
        rest = rest[rest.index(verbs[0]) + 1 :]
    return parsers


def _options(parsers: Sequence[argparse.ArgumentParser]) -> dict[str, argparse.Action]:
    return {
        flag: action for p in parsers for action in p._actions for flag in action.option_strings
    }


def _sample(action: argparse.Action, placeholder: str) -> str:
    if action.choices:
        return str(next(iter(action.choices)))
    kind = action.type
    if kind is None or kind is str:
        return placeholder
    for value in SAMPLES:
        with contextlib.suppress(Exception):
            kind(value)  # type: ignore[operator]
            return value
    return placeholder


def flag_problems(argv: Sequence[str]) -> list[str]:
    """Verbs and flags of a command line that the parser does not have, by their full names."""
    try:
        parsers = chain(build_parser(), argv)
    except LookupError as exc:
        return [str(exc)]
    options = _options(parsers)
    problems = []
    for word in argv:
        flag = word.split("=", 1)[0]
        if word.startswith("-") and word != "-" and flag not in options:
            near = sorted(o for o in options if o.startswith(flag[:4]))
            problems.append(f"no option {flag}" + (f" (options like it: {near})" if near else ""))
    return problems


def with_samples(argv: Sequence[str]) -> list[str]:
    """``argv`` with each placeholder value of an option replaced by a value of its type."""
    options = _options(chain(build_parser(), argv))
    out = list(argv)
    for index, word in enumerate(argv):
        action = options.get(word)
        if action is None or action.nargs == 0:
            continue
        for value_index in range(index + 1, min(len(argv), index + 1 + _arity(action))):
            if PLACEHOLDER.match(argv[value_index]):
                out[value_index] = _sample(action, argv[value_index])
    return out


def _arity(action: argparse.Action) -> int:
    if isinstance(action.nargs, int):
        return action.nargs
    return 1 if action.nargs in (None, "?") else 1_000


def parse_problem(argv: Sequence[str]) -> str | None:
    """argparse's complaint about a command line, or None when it parses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(with_samples(argv))
    except SystemExit as exc:
        return err.getvalue().strip().splitlines()[-1] if exc.code else None
    except LookupError as exc:
        return str(exc)
    return None


def hrwcron_problems(command: Command) -> list[str]:
    tree = bracket_tree(command.words[1:])
    problems: list[str] = []
    for argv in variants(tree):
        for problem in flag_problems(argv):
            if problem not in problems:
                problems.append(problem)
        if command.block and not problems:
            problem = parse_problem(argv)
            if problem:
                problems.append(f"hrwcron {' '.join(argv)}: {problem}")
    return problems


def makefile() -> tuple[set[str], set[str]]:
    """The Makefile's targets and variables."""
    targets: set[str] = set()
    variables: set[str] = set()
    for line in (ROOT / "Makefile").read_text().splitlines():
        if line.startswith(("\t", "#")):
            continue
        if m := re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(?:\?|:|\+)?=", line):
            variables.add(m.group(1))
        elif m := re.match(r"^([^:=#]+):(?!=)", line):
            targets.update(t for t in m.group(1).split() if "$" not in t and "%" not in t)
    return targets, variables


def make_problems(command: Command) -> list[str]:
    targets, variables = makefile()
    problems = []
    for word in command.words[1:]:
        if PLACEHOLDER.match(word.text):
            continue  # `make chaos SEED=… DURATION=…` in running text
        if ASSIGNMENT.match(word.text):
            name = word.text.split("=", 1)[0]
            if name not in variables:
                problems.append(f"the Makefile has no variable {name}")
        elif word.text.startswith("-"):
            problems.append(f"make option {word.text} (the documentation uses none)")
        elif word.text not in targets:
            problems.append(f"the Makefile has no target {word.text}")
    return problems


def problems_of(command: Command) -> list[str]:
    if command.program == "make":
        return make_problems(command)
    return hrwcron_problems(command)


# --- Tests ----------------------------------------------------------------------------------------

COMMANDS = all_commands()


def test_the_documentation_shows_commands_to_check() -> None:
    blocks = [c for c in COMMANDS if c.block]
    assert sum(c.program == "hrwcron" for c in blocks) >= 30, [str(c) for c in blocks]
    assert {"make run", "make test"} <= {str(c) for c in blocks if c.where.startswith("README")}
    verbs = {c.words[1].text for c in COMMANDS if c.program == "hrwcron" and len(c.words) > 1}
    assert {"next", "jobs", "apply", "import", "provision", "run"} <= verbs


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.where} {c}"[:120])
def test_documented_command_runs(command: Command) -> None:
    assert problems_of(command) == [], f"{command.where}: {command}"


def check_text(text: str) -> list[str]:
    return [p for c in extract(ROOT / "docs" / "x.md", text) for p in problems_of(c)]


def test_a_renamed_flag_fails() -> None:
    assert check_text("```\nhrwcron next '0 9 * * *' --count 2\n```\n") == []
    assert check_text("```\nhrwcron next '0 9 * * *' --counts 2\n```\n")
    # argparse would take the abbreviation; the documentation must name the flag in full.
    assert check_text("```\nhrwcron next '0 9 * * *' --cou 2\n```\n")
    assert check_text("Run `hrwcron next --counts 2` to see.\n")


def test_a_wrong_verb_value_or_arity_fails() -> None:
    assert check_text("```\nhrwcron jobz ls\n```\n")
    assert check_text("```\nhrwcron jobs lz\n```\n")
    assert check_text("```\nhrwcron next '0 9 * * *' --count many\n```\n")
    assert check_text("```\nhrwcron next '0 9 * * *' --count\n```\n")
    # Output lines of a block with prompts are not commands.
    assert (
        check_text("```\n$ hrwcron next '0 9 * * *'\nhrwcron next: error: x --bogus\n```\n") == []
    )


def test_a_synopsis_checks_each_optional_part_and_alternative() -> None:
    assert check_text("```\nhrwcron status [JOB] [--prefix P] [--limit N | --all]\n```\n") == []
    assert check_text("```\nhrwcron status [JOB] [--limit N | --everything]\n```\n")
    assert check_text("```\nhrwcron import crontab FILE [--apply [--dry-runs]]\n```\n")
    # Both alternatives together would be refused; each alone parses.
    assert check_text("```\nhrwcron status [--limit N | --all]\n```\n") == []


def test_make_commands_name_targets_and_variables() -> None:
    assert check_text("```\nmake chaos SEED=7 DURATION=1800   # long\nmake check\n```\n") == []
    assert check_text("```\nmake docz\n```\n")
    assert check_text("Run `make chaos SEEDS=7`.\n")


def test_shell_words_and_segments() -> None:
    words = split_words("A=1 hrwcron next '30 2 * * *' --tz \"X/Y\" > out.txt; make check # c")
    found = [command_of(s) for s in segments(words)]
    assert [[w.text for w in f] for f in found if f] == [
        ["hrwcron", "next", "30 2 * * *", "--tz", "X/Y"],
        ["make", "check"],
    ]


def _slug(heading: str) -> str:
    """A heading's anchor, as GitHub and MkDocs' toc both make it for these headings."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return re.sub(r"[ -]+", "-", text)


def _anchors(path: Path) -> set[str]:
    fenced = False
    anchors = set()
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"^#{1,6} (.+?)\s*$", line)):
            anchors.add(_slug(m.group(1)))
    return anchors


def test_the_readme_links_resolve() -> None:
    """The README is not part of the site, so the strict build does not see its links: each
    one names a file of the repository, and a heading of it when it names an anchor."""
    readme = ROOT / "README.md"
    text = re.sub(r"(?ms)^```.*?^```", "", readme.read_text())
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert links
    for target in links:
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (ROOT / path) if path else readme
        assert file.exists(), f"README.md links to {target}, which does not exist"
        if anchor:
            assert anchor in _anchors(file), f"README.md links to {target}: no such heading"


def test_the_generated_performance_block_is_on_the_performance_page() -> None:
    """`make bench` rewrites the block between these markers on docs/performance.md; without
    them a full run would leave the page's figures stale, saying nothing."""
    import sys

    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from bench.__main__ import PERFORMANCE_PAGE, README_BEGIN, README_END

    page = PERFORMANCE_PAGE.read_text()
    assert page.count(README_BEGIN) == 1 and page.count(README_END) == 1
    assert page.index(README_BEGIN) < page.index(README_END)
    assert README_BEGIN not in (ROOT / "README.md").read_text()
