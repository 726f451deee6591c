"""What the README, the site's pages and the --help examples say about the
command line and the library, checked against the code: every `wdiff ...`
command they show names a real command and only options it has, and every
Python snippet imports names that exist and calls the public functions with
keywords they take. (Running them against a real Hub is not possible
offline; the README's jobs run for real in test_docs.py.)"""

from __future__ import annotations

import ast
import os
import importlib
import inspect
import re
import shlex

SHELL_FENCES = ("sh", "bash", "shell", "console", "text")
_SEPARATORS = {"|", "||", "&&", ";", "&", ")", "(", "<(", "$(", ">", ">>", "<", "2>", "2>&1"}


def fenced(text: str, langs: tuple[str, ...]) -> list[str]:
    """The bodies of the fenced code blocks in ``text`` whose language is one of ``langs``."""
    return [body for lang, body in re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M) if lang in langs]


def shell_lines(text: str) -> list[str]:
    """Command lines that mention wdiff: in shell blocks (continuations
    joined), and inline code spans that start with ``wdiff ``."""
    out = []
    for body in fenced(text, SHELL_FENCES):
        body = re.sub(r"\\\n\s*", " ", body)
        out += [line for line in body.splitlines() if re.search(r"(^|[\s/(;|&])wdiff\s", line)]
    out += re.findall(r"(?<![\w.])`(wdiff [^`]+)`", text)
    return out


def _tokens(line: str) -> list[str]:
    lex = shlex.shlex(line, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        return list(lex)
    except ValueError:  # an unbalanced quote in prose: take the words as they are
        return line.split()


def check_command_line(group, line: str) -> list[str]:
    """Problems with the wdiff invocations in ``line``: unknown commands, and
    options the command does not have."""
    problems = []
    tokens = _tokens(line)
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        i += 1
        if tok != "wdiff" and not tok.endswith("/wdiff"):
            continue
        if i >= len(tokens) or tokens[i] in _SEPARATORS:
            continue
        name = tokens[i]
        if name.startswith("-"):
            if name not in ("--version", "-h", "--help"):
                problems.append(f"{line!r}: wdiff has no global option {name}")
            continue
        if not re.fullmatch(r"[a-z][a-z-]*", name):
            continue  # a placeholder (`wdiff COMMAND --help`) or not a command line (`wdiff chain/2 ...`)
        try:
            cmd = group.commands[name]
        except KeyError:
            problems.append(f"{line!r}: no command {name!r}")
            continue
        opts = {"-h", "--help"}
        for p in cmd.params:
            opts.update(getattr(p, "opts", ()))
            opts.update(getattr(p, "secondary_opts", ()))
        i += 1
        while i < len(tokens) and tokens[i] not in _SEPARATORS:
            word = tokens[i].split("=", 1)[0]
            if word.startswith("-") and word != "-" and not re.fullmatch(r"-\d+", word) and word not in opts:
                problems.append(f"{line!r}: `wdiff {name}` has no option {word}")
            i += 1
    return problems


def check_python(block: str) -> list[str]:
    """Problems with a Python snippet: names imported from wdiff that do not
    exist, and calls of wdiff's functions and classes with keywords their
    signatures do not take."""
    try:
        tree = ast.parse(block)
    except SyntaxError as e:
        return [f"not Python: {e}\n{block}"]
    try:
        return _check_python(tree)
    except ModuleNotFoundError as e:  # a snippet of an optional extra (vllm) where it is not installed
        if (e.name or "").split(".")[0] == "wdiff" or os.environ.get("CI"):
            return [f"imports what is not installed: {e}\n{block}"]
        return []


def _check_python(tree) -> list[str]:
    problems = []
    names: dict[str, object] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name == "wdiff" or a.name.startswith("wdiff."):
                    names[a.asname or a.name] = importlib.import_module(a.name)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "wdiff":
            module = importlib.import_module(node.module)
            for a in node.names:
                if not hasattr(module, a.name):
                    problems.append(f"{node.module} has no {a.name}")
                else:
                    names[a.asname or a.name] = getattr(module, a.name)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        target = None
        f = node.func
        if isinstance(f, ast.Name) and f.id in names:
            target = names[f.id]
        elif isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in names:
            owner = names[f.value.id]
            if inspect.ismodule(owner):
                if not hasattr(owner, f.attr):
                    problems.append(f"{owner.__name__} has no {f.attr}")
                    continue
                target = getattr(owner, f.attr)
        if target is None or not callable(target):
            continue
        try:
            params = inspect.signature(target).parameters
        except (TypeError, ValueError):
            continue
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            continue
        for kw in node.keywords:
            if kw.arg is not None and kw.arg not in params:
                problems.append(f"{getattr(target, '__qualname__', target)} takes no keyword {kw.arg}")
    return problems
