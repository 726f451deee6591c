"""Man pages and shell completions, generated from the Typer app itself.

``wdiff generate [ROOT]`` writes ``man/wdiff.1``, ``man/wdiff-COMMAND.1``
and ``completions/{wdiff.bash,_wdiff,wdiff.fish}`` under ROOT, and the
documentation site's reference pages (``docs/reference/cli.md``, ``api.md``
and ``format.md``: :mod:`wdiff.cli.gendocs`); ``--check`` only compares. The output depends on nothing but the app (a fixed date, no
environment), so the committed files can be checked for drift in CI.
``man/wdiff-format.5`` is written by hand: it is the format's specification;
the wheel carries a copy (setup.py), which :func:`format_page` finds.

``wdiff man [COMMAND]`` and ``wdiff completion SHELL`` print the same text
at run time (:func:`page`, :func:`completion`), so an installed wdiff has its
pages and completions without a source tree, and they cannot drift.

The completion scripts are static: a TAB costs no Python start-up.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from typer.core import TyperGroup

from ..defaults import __version__
from ..errors import EXIT_CODE_TABLE
from .help import EXAMPLES, EXIT_NOTES

MAN_DATE = "2026-12-01"
ENVIRONMENT = [
    ("WDIFF_THREADS", "Worker threads (default: all cores). --threads overrides it."),
    ("WDIFF_CACHE_DIR", "Where the manifest cache keeps the block digests of files already hashed "
                        "(default: $XDG_CACHE_HOME/wdiff or ~/.cache/wdiff); none turns it off. Safe to delete. "
                        "Its entries are only guesses, used by pull to choose bundles; no result rests on them."),
    ("WDIFF_NATIVE", "Set to 0 to use the numpy kernels instead of the C extension (same results, slower); "
                     "wdiff --version says which are in use."),
    ("WDIFF_DIRECT", "Set to 0 to have apply write the tensor data it rebuilds through the page cache "
                     "instead of with O_DIRECT (the same bytes, fsynced the same; slower, and it fills the cache)."),
    ("WDIFF_TRUSTED_KEYS", "Public key files, separated by colons as in PATH, used where --trusted-key is not given: "
                           "pull, apply, status, log and commit then accept only what one of them signed."),
    ("WDIFF_STATE_DIR", "Where this user's records of signed remotes (the newest chain accepted from each) and the key "
                        "of pull --atomic's version lists are kept (default: $XDG_STATE_HOME/wdiff or "
                        "~/.local/state/wdiff)."),
    ("WDIFF_VLLM_CACHE", "Where the vLLM backend keeps this host's copy of the remote it follows, shared by the "
                         "engine's workers (default: ~/.cache/wdiff/vllm)."),
    ("WDIFF_DEBUG", "Set to 1 to print a traceback with every error."),
    ("NO_COLOR", "Never use colour."),
    ("HF_TOKEN", "Hugging Face token, resolved by huggingface_hub (as are hf auth login and "
                 "HF_HOME); wdiff never reads, logs or prints it."),
    ("HF_ENDPOINT", "Hugging Face Hub endpoint, for hf:// remotes."),
    ("HF_HUB_DISABLE_XET", "Set to 1 to upload to Hub repositories through LFS instead of Xet."),
    ("AWS_ENDPOINT_URL", "S3 endpoint, for s3:// remotes on S3-compatible stores (R2, MinIO...); with "
                         "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and AWS_PROFILE read by "
                         "botocore as usual. wdiff never prints them."),
]


@dataclass(frozen=True)
class Param:
    names: tuple[str, ...]  # ("-o", "--output") for options; () for arguments
    metavar: str  # "" for flags
    help: str
    is_file: bool  # completes file names
    required: bool


@dataclass(frozen=True)
class Command:
    name: str
    summary: str
    paragraphs: tuple[str, ...]
    arguments: tuple[Param, ...]
    options: tuple[Param, ...]


_FILE_OPTIONS = {"--output", "--base"}
_VALUE_METAVARS = {"--threads": "N", "--level": "N", "--size-mb": "MB", "--label": "TEXT"}


def commands(group: TyperGroup) -> list[Command]:
    """The visible commands of ``group`` (the root of the command line)."""
    out = []
    for name, cmd in group.commands.items():
        if cmd.hidden:
            continue
        doc = (cmd.help or "").strip()
        paras = [re.sub(r"\s+", " ", p.strip()) for p in doc.split("\n\n") if p.strip()]
        args, opts = [], []
        for p in cmd.params:
            if getattr(p, "hidden", False):
                continue
            if p.param_type_name == "argument":
                args.append(Param((), p.metavar or p.name.upper(), p.help or "", True, p.required))
                continue
            names = tuple(sorted(p.opts + p.secondary_opts, key=lambda n: (len(n) > 2, n)))
            flag = bool(getattr(p, "is_flag", False) or getattr(p, "count", False))
            long = next((n for n in names if n.startswith("--")), names[0])
            metavar = "" if flag else (p.metavar or _VALUE_METAVARS.get(long) or long.lstrip("-").upper())
            opts.append(Param(names, metavar, p.help or "", long in _FILE_OPTIONS, p.required))
        opts.append(Param(("-h", "--help"), "", "Show the help and exit.", False, False))
        out.append(Command(name, paras[0] if paras else "", tuple(paras[1:]), tuple(args), tuple(opts)))
    return out


def app_help(group: TyperGroup) -> list[str]:
    text = group.help or ""
    return [re.sub(r"\s+", " ", p.strip()) for p in text.split("\n\n") if p.strip()]


# -- man pages ---------------------------------------------------------------------------


def _roff(text: str) -> str:
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return "\n".join(("\\&" + line) if line[:1] in (".", "'") else line for line in text.split("\n"))


def _th(name: str, section: int) -> str:
    return (
        f'.\\" Generated by `wdiff generate` from the command line itself; do not edit.\n'
        f'.TH {name.upper()} {section} "{MAN_DATE}" "wdiff {__version__}" "wdiff manual"\n'
        ".nh\n.ad l\n"  # no hyphenation, ragged right: names like wdiff-pull stay whole
    )


def _exit_table() -> str:
    rows = "\n".join(f".TP\n.B {code}\n{_roff(text)}" for code, text in EXIT_CODE_TABLE)
    return ".SH EXIT STATUS\n" + rows + "\n"


def _environment() -> str:
    return ".SH ENVIRONMENT\n" + "\n".join(f".TP\n.B {n}\n{_roff(t)}" for n, t in ENVIRONMENT) + "\n"


def _examples(lines: list[str]) -> str:
    body = "\n".join(_roff(line) for line in lines)
    return f".SH EXAMPLES\n.PP\n.RS 4\n.nf\n{body}\n.fi\n.RE\n"


def _synopsis_param(p: Param) -> str:
    if not p.names:
        return f"\\fI{_roff(p.metavar)}\\fR"
    flag = f"\\fB{_roff(p.names[-1])}\\fR" + (f" \\fI{_roff(p.metavar)}\\fR" if p.metavar else "")
    return flag if p.required else f"[{flag}]"


def man_command(c: Command, all_names: list[str]) -> str:
    out = [_th(f"wdiff-{c.name}", 1)]
    out.append(f".SH NAME\nwdiff\\-{c.name} \\- {_roff(c.summary.rstrip('.'))}\n")
    required = [p for p in c.options if p.required]
    syn = " ".join([_synopsis_param(p) for p in required] + ["[\\fIOPTIONS\\fR]"] + [_synopsis_param(a) for a in c.arguments])
    out.append(f".SH SYNOPSIS\n.B wdiff {c.name}\n{syn}\n")
    out.append(".SH DESCRIPTION\n" + _roff(c.summary) + "\n" + "".join(f".PP\n{_roff(p)}\n" for p in c.paragraphs))
    if c.arguments:
        out.append(".SH ARGUMENTS\n" + "".join(f".TP\n.I {_roff(a.metavar)}\n{_roff(a.help)}\n" for a in c.arguments))
    opts = []
    for p in c.options:
        names = ", ".join(f"\\fB{_roff(n)}\\fR" for n in p.names)
        if p.metavar:
            names += f" \\fI{_roff(p.metavar)}\\fR"
        opts.append(f".TP\n{names}\n{_roff(p.help)}\n")
    out.append(".SH OPTIONS\n" + "".join(opts))
    out.append(_examples(EXAMPLES.get(c.name, [])))
    out.append(_exit_table().replace(".SH EXIT STATUS\n", f".SH EXIT STATUS\n{_roff(EXIT_NOTES.get(c.name, ''))}\n.PP\nAll codes:\n"))
    out.append(_environment())
    others = ",\n".join(f"wdiff\\-{n}(1)" for n in all_names if n != c.name)
    out.append(f".SH SEE ALSO\n.BR wdiff (1),\n{others},\n.BR wdiff\\-format (5)\n")
    return "".join(out)


def man_main(cmds: list[Command], group: TyperGroup) -> str:
    paras = app_help(group)
    out = [_th("wdiff", 1)]
    out.append(f".SH NAME\nwdiff \\- {_roff(paras[0].rstrip('.'))}\n")
    out.append(".SH SYNOPSIS\n.B wdiff\n\\fICOMMAND\\fR [\\fIOPTIONS\\fR] [\\fIARGS\\fR...]\n.br\n.B wdiff\n"
               "[\\fB\\-\\-version\\fR | \\fB\\-h\\fR]\n")
    out.append(".SH DESCRIPTION\n" + "".join(f".PP\n{_roff(p)}\n" for p in paras[1:]))
    out.append(
        ".PP\nResults go to standard output: a plain table, or with \\fB\\-\\-json\\fR exactly one "
        "JSON document with a \\fBschema\\fR member. Messages, warnings and progress (only on a "
        "terminal) go to standard error. \\fB\\-q\\fR prints nothing on success; \\fB\\-v\\fR adds "
        "detail. Names read from checkpoints and bundles are escaped before they are printed.\n"
    )
    out.append(".SH COMMANDS\n" + "".join(
        f".TP\n.B {c.name}\n{_roff(c.summary)} See \\fBwdiff\\-{c.name}\\fR(1).\n" for c in cmds))
    out.append(".SH OPTIONS\n.TP\n\\fB\\-\\-version\\fR\nPrint the version and exit.\n"
               ".TP\n\\fB\\-h\\fR, \\fB\\-\\-help\\fR\nShow the help and exit.\n")
    out.append(_exit_table())
    out.append(_environment())
    out.append(".SH FILES\n.TP\n.I DIR/.wdiff/\nwdiff's state inside a checkpoint directory (the lock and, while an in-place "
               "apply runs, its journal); never part of the checkpoint.\n.TP\n.I .DIR.wdiff\\-lock\n"
               "beside a directory that \\fBwdiff pull\\fR maintains: keeps two pulls from both writing.\n")
    out.append(".SH SEE ALSO\n" + ",\n".join(f"wdiff\\-{c.name}(1)" for c in cmds) + ",\n.BR wdiff\\-format (5)\n")
    return "".join(out)


# -- completions -------------------------------------------------------------------------


def _words(ps) -> str:
    return " ".join(n for p in ps for n in p.names)


def bash(cmds: list[Command]) -> str:
    cases = []
    for c in cmds:
        takes_value = [n for p in c.options if p.metavar for n in p.names]
        file_value = [n for p in c.options if p.metavar and p.is_file for n in p.names]
        cases.append(
            f"        {c.name})\n"
            + ("            case \"$prev\" in\n"
               + (f"                {'|'.join(file_value)}) COMPREPLY=($(compgen -f -- \"$cur\")); return ;;\n" if file_value else "")
               + (f"                {'|'.join(n for n in takes_value if n not in file_value)}) return ;;\n"
                  if set(takes_value) - set(file_value) else "")
               + "            esac\n" if takes_value else "")
            + f"            if [[ \"$cur\" == -* ]]; then\n"
            f"                COMPREPLY=($(compgen -W \"{_words(c.options)}\" -- \"$cur\"))\n"
            f"            else\n"
            f"                COMPREPLY=($(compgen -f -- \"$cur\"))\n"
            f"            fi\n"
            f"            ;;\n"
        )
    names = " ".join(c.name for c in cmds)
    return (
        "# bash completion for wdiff. Generated by `wdiff generate`; do not edit.\n"
        "# Install: source this file, or copy it to /usr/share/bash-completion/completions/wdiff\n"
        "_wdiff() {\n"
        "    local cur prev cmd i\n"
        "    COMPREPLY=()\n"
        "    cur=\"${COMP_WORDS[COMP_CWORD]}\"\n"
        "    prev=\"${COMP_WORDS[COMP_CWORD-1]}\"\n"
        "    cmd=\"\"\n"
        "    for ((i = 1; i < COMP_CWORD; i++)); do\n"
        "        case \"${COMP_WORDS[i]}\" in\n"
        "            -*) ;;\n"
        "            *) cmd=\"${COMP_WORDS[i]}\"; break ;;\n"
        "        esac\n"
        "    done\n"
        "    if [[ -z \"$cmd\" ]]; then\n"
        f"        COMPREPLY=($(compgen -W \"{names} --version --help -h\" -- \"$cur\"))\n"
        "        return\n"
        "    fi\n"
        "    case \"$cmd\" in\n"
        + "".join(cases)
        + "    esac\n"
        "}\n"
        "complete -o filenames -o bashdefault -F _wdiff wdiff\n"
    )


def _zsh_desc(text: str) -> str:
    return re.sub(r"[\[\]:'\\`$\"]", "", text.split(". ")[0].rstrip("."))


def zsh(cmds: list[Command]) -> str:
    lines = ["#compdef wdiff", "# zsh completion for wdiff. Generated by `wdiff generate`; do not edit.",
             "# Install: copy to a directory in $fpath (e.g. /usr/share/zsh/site-functions/_wdiff)", "",
             "_wdiff() {", "    local -a commands", "    commands=("]
    lines += [f"        '{c.name}:{_zsh_desc(c.summary)}'" for c in cmds]
    lines += ["    )",
              "    _arguments -C '(- *)'{-h,--help}'[show the help]' '(- *)--version[print the version]' "
              "'1: :->command' '*:: :->args'",
              "    case $state in",
              "        command) _describe -t commands 'wdiff command' commands ;;",
              "        args)",
              "            case $words[1] in"]
    for c in cmds:
        specs = []
        for p in c.options:
            desc = _zsh_desc(p.help)
            value = (":" + p.metavar.lower() + (":_files" if p.is_file else ":")) if p.metavar else ""
            if len(p.names) > 1:
                excl = " ".join(p.names)
                specs.append(f"'({excl})'{{{','.join(p.names)}}}'[{desc}]{value}'")
            else:
                specs.append(f"'{p.names[0]}[{desc}]{value}'")
        specs.append("'*:file:_files'")
        lines.append(f"                {c.name}) _arguments " + " ".join(specs) + " ;;")
    lines += ["            esac", "            ;;", "    esac", "}", "", '_wdiff "$@"', ""]
    return "\n".join(lines)


def _fish_desc(text: str) -> str:
    return text.split(". ")[0].rstrip(".").replace("\\", "").replace("'", "")


def fish(cmds: list[Command]) -> str:
    names = " ".join(c.name for c in cmds)
    out = ["# fish completion for wdiff. Generated by `wdiff generate`; do not edit.",
           "# Install: copy to ~/.config/fish/completions/wdiff.fish", "",
           "complete -c wdiff -f",
           f"complete -c wdiff -n 'not __fish_seen_subcommand_from {names}' -l version -d 'Print the version'",
           f"complete -c wdiff -n 'not __fish_seen_subcommand_from {names}' -s h -l help -d 'Show the help'"]
    for c in cmds:
        out.append(f"complete -c wdiff -n 'not __fish_seen_subcommand_from {names}' -a {c.name} -d '{_fish_desc(c.summary)}'")
    for c in cmds:
        cond = f"-n '__fish_seen_subcommand_from {c.name}'"
        out.append(f"complete -c wdiff {cond} -F")
        for p in c.options:
            flags = " ".join(f"-l {n[2:]}" if n.startswith("--") else f"-s {n[1:]}" for n in p.names)
            value = (" -r -F" if p.is_file else " -x") if p.metavar else ""
            out.append(f"complete -c wdiff {cond} {flags}{value} -d '{_fish_desc(p.help)}'")
    return "\n".join(out) + "\n"


# -- writing and checking ------------------------------------------------------------------


def render(group: TyperGroup) -> dict[str, str]:
    """Every generated file for the command line ``group``, by path relative
    to the project root."""
    cmds = commands(group)
    names = [c.name for c in cmds]
    files = {"man/wdiff.1": man_main(cmds, group)}
    for c in cmds:
        files[f"man/wdiff-{c.name}.1"] = man_command(c, names)
    files["completions/wdiff.bash"] = bash(cmds)
    files["completions/_wdiff"] = zsh(cmds)
    files["completions/wdiff.fish"] = fish(cmds)
    return files


#: the shells ``wdiff completion`` knows, and the file each script is kept in
SHELLS = {"bash": "completions/wdiff.bash", "zsh": "completions/_wdiff", "fish": "completions/wdiff.fish"}
FORMAT_PAGE = "wdiff-format.5"


def page(group: TyperGroup, name: str | None = None) -> str:
    """The man page of ``name`` (a command, or "format" for the bundle
    format's specification); of wdiff itself when ``name`` is None."""
    if name == "format":
        return format_page()
    rel = "man/wdiff.1" if name is None else f"man/wdiff-{name}.1"
    pages = render(group)
    if rel not in pages:
        from ..errors import UsageError

        names = ", ".join([c.name for c in commands(group)] + ["format"])
        raise UsageError(f"no man page for {name!r}", hint=f"one of: {names}")
    return pages[rel]


def completion(group: TyperGroup, shell: str) -> str:
    """The completion script for ``shell`` (bash, zsh or fish)."""
    if shell not in SHELLS:
        from ..errors import UsageError

        raise UsageError(f"no completion script for {shell!r}", hint=f"one of: {', '.join(SHELLS)}")
    return render(group)[SHELLS[shell]]


def format_page() -> str:
    """man/wdiff-format.5: the copy in the installed package, or the source
    tree's own when running from a checkout."""
    from importlib import resources

    shipped = resources.files(__package__).joinpath(FORMAT_PAGE)
    if shipped.is_file():
        return shipped.read_text(encoding="utf-8")
    source = os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "man", FORMAT_PAGE)
    try:
        with open(source, encoding="utf-8") as f:
            return f.read()
    except OSError:
        from ..errors import NotFoundError

        raise NotFoundError(f"{FORMAT_PAGE} is not installed with this wdiff") from None


def render_all(group: TyperGroup) -> dict[str, str]:
    """What ``wdiff generate`` writes: :func:`render`'s man pages and
    completions, and the documentation site's reference pages
    (:mod:`wdiff.cli.gendocs`: the commands, the Python API, the format)."""
    from .gendocs import render_docs

    files = render(group)
    files.update(render_docs(commands(group), app_help(group), ENVIRONMENT, format_page()))
    return files


def write(root: str, group: TyperGroup) -> list[str]:
    """Write every generated file under ``root``; returns those that changed."""
    changed = []
    for rel, text in render_all(group).items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        old = open(path, encoding="utf-8").read() if os.path.exists(path) else None
        if old != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(text)
            changed.append(rel)
    return changed


def check(root: str, group: TyperGroup) -> list[str]:
    """Generated files that are missing or differ from what would be written."""
    drift = []
    for rel, text in render_all(group).items():
        path = os.path.join(root, rel)
        if not os.path.exists(path) or open(path, encoding="utf-8").read() != text:
            drift.append(rel)
    return drift
