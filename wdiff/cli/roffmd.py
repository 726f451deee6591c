"""The bundle format's specification, man/wdiff-format.5, as Markdown for the
documentation site: one source, two renderings, so they cannot disagree.

This reads the subset of man(7) and tbl(1) the page is written in: sections
(.SH, .SS), paragraphs (.PP), tagged and indented paragraphs (.TP, .IP),
no-fill blocks (.nf/.fi), relative indents (.RS/.RE, which Markdown has no
use for), font macros (.B, .I, .BR, .IR, .RB, .BI, .IB, .RI) and escapes,
and tbl tables. Anything else in the page (a new request, an unknown
escape) raises ValueError: the generator fails rather than drop a rule of
the specification."""

from __future__ import annotations

import re

_CHARS = {
    "bu": "•", "dq": '"', "lq": "“", "rq": "”", "em": "—", "en": "–", "mu": "×", "<=": "≤", ">=": "≥",
    "!=": "≠", "lc": "⌈", "rc": "⌉", "lf": "⌊", "rf": "⌋", "*d": "δ", "aq": "'", "ti": "~", "->": "→",
}
_IGNORED = {"nh", "ad", "na", "hy", "ft", "RS", "RE", "sp", "br", "PD", "in"}
_FONT_MACROS = {"B": "B", "I": "I", "BR": "BR", "IR": "IR", "RB": "RB", "BI": "BI", "IB": "IB", "RI": "RI"}
_ESCAPE_MD = re.compile(r"([\\`*_\[\]|])")


def _args(rest: str) -> list[str]:
    """A request's arguments, with roff's quoting ("" inside quotes is a quote)."""
    out, i, n = [], 0, len(rest)
    while i < n:
        if rest[i] in " \t":
            i += 1
            continue
        if rest[i] == '"':
            j, buf = i + 1, []
            while j < n:
                if rest[j] == '"':
                    if j + 1 < n and rest[j + 1] == '"':
                        buf.append('"')
                        j += 2
                        continue
                    break
                buf.append(rest[j])
                j += 1
            out.append("".join(buf))
            i = j + 1
        else:
            j = i
            while j < n and rest[j] not in " \t":
                j += 1
            out.append(rest[i:j])
            i = j
    return out


def _runs(text: str, font: str = "R") -> list[tuple[str, str]]:
    """``text`` as (font, plain text) runs, escapes resolved; font is R, B or I."""
    runs: list[tuple[str, str]] = []
    buf: list[str] = []
    i, n = 0, len(text)

    def flush():
        if buf:
            runs.append((font, "".join(buf)))
            buf.clear()

    while i < n:
        c = text[i]
        if c != "\\":
            buf.append(c)
            i += 1
            continue
        if i + 1 >= n:
            raise ValueError(f"a backslash ends the line: {text!r}")
        e = text[i + 1]
        if e == "f":
            if text.startswith("(CR", i + 2) or text.startswith("(CW", i + 2):
                flush()
                font, i = "R", i + 5
                continue
            f = text[i + 2:i + 3]
            if f not in ("B", "I", "R", "P"):
                raise ValueError(f"unknown font escape in {text!r}")
            flush()
            font = "R" if f in ("R", "P") else f
            i += 3
        elif e == "(":
            name = text[i + 2:i + 4]
            if name not in _CHARS:
                raise ValueError(f"unknown special character \\({name} in {text!r}")
            buf.append(_CHARS[name])
            i += 4
        elif e in "-e&":
            buf.append({"-": "-", "e": "\\", "&": ""}[e])
            i += 2
        elif e == " ":
            buf.append(" ")
            i += 2
        else:
            raise ValueError(f"unknown escape \\{e} in {text!r}")
    flush()
    return runs


def _md_runs(runs: list[tuple[str, str]], table: bool = False) -> str:
    runs = [(f, t) for f, t in runs if t]
    out = []
    for k, (font, text) in enumerate(runs):
        esc = _ESCAPE_MD.sub(r"\\\1", text).replace("<", "&lt;")
        if not table:
            esc = esc.replace("\\|", "|")
        if font == "R" or not text.strip():
            out.append(esc)
            continue
        lead = esc[: len(esc) - len(esc.lstrip())]
        trail = esc[len(esc.rstrip()):]
        # emphasis that touches other emphasis (.BI, .IB) would read as *** in
        # Markdown: such runs are written as HTML
        touches = (k > 0 and not lead and runs[k - 1][0] != "R" and not runs[k - 1][1][-1:].isspace()) or (
            k + 1 < len(runs) and not trail and runs[k + 1][0] != "R" and not runs[k + 1][1][:1].isspace())
        if touches:
            tag = "strong" if font == "B" else "em"
            out.append(f"{lead}<{tag}>{esc.strip()}</{tag}>{trail}")
        else:
            mark = "**" if font == "B" else "*"
            out.append(f"{lead}{mark}{esc.strip()}{mark}{trail}")
    return "".join(out)


def _plain(runs: list[tuple[str, str]]) -> str:
    return "".join(t for _, t in runs)


def _font_macro(name: str, rest: str) -> list[tuple[str, str]]:
    args = _args(rest)
    if name in ("B", "I"):
        return _runs(" ".join(args), name)
    fonts = _FONT_MACROS[name]
    runs: list[tuple[str, str]] = []
    for k, a in enumerate(args):
        runs += _runs(a, fonts[k % 2])
    return runs


class _Writer:
    def __init__(self) -> None:
        self.blocks: list[str] = []
        self.para: list[list[tuple[str, str]]] = []
        self.prefix = ""  # a list item's marker, or a tagged paragraph's term
        self.expect_tag = False

    def line(self, runs: list[tuple[str, str]]) -> None:
        if self.expect_tag:
            term = _md_runs(runs).strip()
            self.prefix = f"{term}: " if term else ""
            self.expect_tag = False
            return
        self.para.append(runs)

    def flush(self) -> None:
        text = " ".join(_md_runs(r).strip() for r in self.para if _plain(r).strip())
        self.para = []
        if not text and not self.prefix:
            return
        if not self.prefix:  # a paragraph must not read as a heading, a list or a quote
            text = re.sub(r"^([#>+-])(\s)", r"\\\1\2", text)
            text = re.sub(r"^(\d+)\.(\s)", r"\1\\.\2", text)
        self.blocks.append(self.prefix + text)
        self.prefix = ""


def roff_to_markdown(source: str) -> str:
    """The man page ``source`` as one Markdown page."""
    w = _Writer()
    lines = source.split("\n")
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if line.startswith(("'\\\"", '.\\"')) or line in (".", ""):
            continue
        if not line.startswith((".", "'")):
            w.line(_runs(line))
            continue
        m = re.match(r"[.'](\S+)\s*(.*)", line)
        name, rest = m.group(1), m.group(2)
        if name == "TH":
            a = _args(rest)
            w.blocks.append(f"# {a[0].replace(chr(92) + '-', '-').lower()}({a[1]})")
        elif name in ("SH", "SS"):
            w.flush()
            title = _plain(_runs(" ".join(_args(rest))))
            w.blocks.append(("## " if name == "SH" else "### ") + title)
        elif name in ("PP", "P", "LP"):
            w.flush()
        elif name == "TP":
            w.flush()
            w.expect_tag = True
        elif name == "IP":
            w.flush()
            tag = _plain(_runs(_args(rest)[0])) if _args(rest) else ""
            w.prefix = "- " if tag == "•" else (f"**{tag}** " if tag else "")
        elif name in _FONT_MACROS:
            w.line(_font_macro(name, rest))
        elif name == "nf":
            w.flush()
            body = []
            while not lines[i].startswith(".fi"):
                raw = lines[i]
                i += 1
                if raw.startswith((".", "'")):
                    sub = re.match(r"[.'](\S+)\s*(.*)", raw)
                    if sub and sub.group(1) in _FONT_MACROS:
                        body.append(_plain(_font_macro(sub.group(1), sub.group(2))))
                    elif sub and sub.group(1) in _IGNORED:
                        continue
                    else:
                        raise ValueError(f"unexpected request in a no-fill block: {raw!r}")
                    continue
                body.append(_plain(_runs(raw)))
            i += 1
            w.blocks.append("```text\n" + "\n".join(body) + "\n```")
        elif name == "TS":
            w.flush()
            i = _table(lines, i, w)
        elif name in _IGNORED:
            if name in ("RS", "RE"):
                w.flush()
        else:
            raise ValueError(f"wdiff-format.5: request .{name} is not converted to Markdown")
    w.flush()
    return "\n\n".join(w.blocks) + "\n"


def _table(lines: list[str], i: int, w: _Writer) -> int:
    """A tbl table from ``lines[i]`` (after .TS) to .TE; returns the index after .TE."""
    tab = "\t"
    first = lines[i]
    if first.rstrip().endswith(";"):
        m = re.search(r"tab\((.)\)", first)
        if m:
            tab = m.group(1)
        i += 1
    formats = []
    while not lines[i].rstrip().endswith("."):
        formats.append(lines[i])
        i += 1
    formats.append(lines[i])
    i += 1
    aligns = formats[0].rstrip(".").split()
    rows: list[list[str]] = []
    header_done = False
    while not lines[i].startswith(".TE"):
        row = lines[i]
        i += 1
        if row in ("_", "="):
            header_done = True
            continue
        rows.append([_md_runs(_runs(c), table=True).strip() or " " for c in row.split(tab)])
    if not header_done:
        raise ValueError("a tbl table without a header rule (_) is not converted")
    width = len(aligns)
    sep = "|" + "|".join("---:" if a.startswith("r") else (":---:" if a.startswith("c") else "---")
                         for a in aligns) + "|"
    out = []
    for k, r in enumerate(rows):
        r = r + [" "] * (width - len(r))
        out.append("| " + " | ".join(r) + " |")
        if k == 0:
            out.append(sep)
    w.blocks.append("\n".join(out))
    return i + 1
