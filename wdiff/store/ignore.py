"""Which files of a directory belong to the checkpoint: gitignore-style
patterns from built-in defaults (trainer state), the root's ``.wdiffignore``
and the command line, the last matching pattern deciding.

The syntax is gitignore's (``man gitignore``): ``#`` comments, ``!`` to
re-include, a trailing ``/`` for directories only, a ``/`` at the start or
in the middle anchors a pattern at the root (otherwise it matches a name at
any depth), ``*`` and ``?`` and ``[...]`` never match ``/``, ``**`` matches
any number of directories, ``\\`` escapes. As in git, a file inside an
excluded directory cannot be re-included: the directory is not entered.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ..errors import UsageError, WdiffIOError

#: the name of the per-checkpoint pattern file, read at the root only
IGNORE_FILE = ".wdiffignore"

#: what a training run writes beside the weights and an inference machine
#: never needs: the state a trainer resumes from. ``--include`` brings any of
#: them back. HF Trainer: optimizer.pt, scheduler.pt, scaler.pt,
#: rng_state*.pth, trainer_state.json, training_args.bin; Accelerate:
#: optimizer*.bin, scheduler*.bin, random_states_*.pkl; DeepSpeed: the
#: global_step*/ directories of ZeRO shards.
DEFAULT_EXCLUDES = (
    "optimizer.pt",
    "scheduler.pt",
    "scaler.pt",
    "rng_state*.pth",
    "trainer_state.json",
    "training_args.bin",
    "optimizer*.bin",
    "scheduler*.bin",
    "random_states_*.pkl",
    "global_step*/",
)


@dataclass(frozen=True, slots=True)
class Pattern:
    source: str  # the text as written, for messages
    negate: bool
    dir_only: bool
    anchored: bool
    regex: re.Pattern

    def matches(self, path: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.anchored:
            return self.regex.fullmatch(path) is not None
        return self.regex.fullmatch(path.rsplit("/", 1)[-1]) is not None


#: what leaves out a file that the recorded version of a directory does not own
UNTRACKED = Pattern("(not part of the recorded version)", False, False, True, re.compile(r"(?!)"))


def _unescaped_trailing_spaces(line: str) -> str:
    """Trailing spaces are dropped unless the last one is escaped."""
    stripped = line.rstrip(" ")
    if stripped != line and stripped.endswith("\\") and (len(stripped) - len(stripped.rstrip("\\"))) % 2 == 1:
        return stripped[:-1] + " "
    return stripped


def compile_pattern(line: str, *, negate: bool = False) -> Pattern | None:
    """One line of a pattern file, or None for a blank line or a comment.
    ``negate`` turns the pattern into an inclusion (``--include``)."""
    text = line.rstrip("\r\n")
    if not text.strip(" ") or text.startswith("#"):
        return None
    body = _unescaped_trailing_spaces(text)
    if body.startswith("!"):
        negate, body = not negate, body[1:]
    elif body.startswith("\\!") or body.startswith("\\#"):
        body = body[1:]
    dir_only = body.endswith("/") and not body.endswith("\\/")
    if dir_only:
        body = body.rstrip("/")
    if not body:
        return None
    anchored = "/" in body
    if body.startswith("/"):
        body = body[1:]
    return Pattern(text, negate, dir_only, anchored, re.compile(_translate(body), re.DOTALL))


def _translate(pat: str) -> str:
    """A gitignore glob (without its trailing /) as a regular expression over
    a whole relative path (anchored) or a single name (not anchored)."""
    out: list[str] = []
    i, n = 0, len(pat)
    while i < n:
        c = pat[i]
        if c == "*" and pat.startswith("**", i):
            j = i + 2
            at_start = i == 0 or pat[i - 1] == "/"
            if at_start and j < n and pat[j] == "/":  # **/ : zero or more directories
                out.append("(?:.*/)?")
                i = j + 1
                continue
            if at_start and j == n and i > 0:  # /** at the end: everything inside
                out.append(".*")
                i = j
                continue
            if at_start and j == n:  # a lone **: anything
                out.append(".*")
                i = j
                continue
            out.append("[^/]*")  # any other ** is a plain *
            i = j
            while i < n and pat[i] == "*":
                i += 1
            continue
        if c == "*":
            out.append("[^/]*")
        elif c == "?":
            out.append("[^/]")
        elif c == "\\" and i + 1 < n:
            i += 1
            out.append(re.escape(pat[i]))
        elif c == "[":
            j = i + 1
            if j < n and pat[j] in "!^":
                j += 1
            if j < n and pat[j] == "]":
                j += 1
            while j < n and pat[j] != "]":
                j += 1
            if j >= n:  # no closing bracket: a literal [
                out.append(re.escape(c))
            else:
                body = pat[i + 1 : j]
                neg = body[:1] in ("!", "^")
                if neg:
                    body = body[1:]
                body = body.replace("\\", "\\\\").replace("^", "\\^").replace("[", "\\[")
                out.append(f"(?!/)[{'^' if neg else ''}{body}]")
                i = j
        else:
            out.append(re.escape(c))
        i += 1
    return "".join(out)


@dataclass(frozen=True)
class Rules:
    """Ordered patterns; the last one that matches a path decides."""

    patterns: tuple[Pattern, ...] = ()
    #: the checkpoint's own pattern file is read when the scan starts
    read_ignore_file: bool = True
    #: how many of ``patterns`` are the built-in defaults (for messages)
    n_defaults: int = 0
    #: when set, only these paths (and the directories above them) can be
    #: part of the checkpoint: the files a recorded version owns, which
    #: narrows what counts as the checkpoint (see :meth:`tracking`)
    tracked: frozenset[str] | None = None
    tracked_dirs: frozenset[str] = frozenset()

    @property
    def active(self) -> bool:
        return bool(self.patterns) or self.tracked is not None

    def tracking(self, paths) -> Rules:
        """These rules, leaving out every file not in ``paths`` as untracked:
        it is never read, and never removed or replaced unasked."""
        paths = frozenset(paths)
        dirs = frozenset(p[:i] for p in paths for i in range(len(p)) if p[i] == "/")
        return Rules(self.patterns, self.read_ignore_file, self.n_defaults, paths, dirs)

    def excluded(self, path: str, is_dir: bool) -> Pattern | None:
        """The exclusion that leaves ``path`` out, or None if it is in."""
        hit = None
        for p in self.patterns:
            if p.matches(path, is_dir):
                hit = p
        if hit is not None and not hit.negate:
            return hit
        if self.tracked is not None and path not in (self.tracked_dirs if is_dir else self.tracked):
            return UNTRACKED
        return None

    def with_file(self, root: str) -> Rules:
        """These rules with ROOT/.wdiffignore inserted after the defaults."""
        if not self.read_ignore_file:
            return self
        path = os.path.join(root, IGNORE_FILE)
        try:
            with open(path, encoding="utf-8", errors="surrogateescape") as f:
                lines = f.read().splitlines()
        except FileNotFoundError:
            return Rules(self.patterns, False, self.n_defaults, self.tracked, self.tracked_dirs)
        except OSError as e:
            raise WdiffIOError(f"{path}: {e.strerror}") from None
        own = tuple(p for p in map(compile_pattern, lines) if p is not None)
        k = self.n_defaults
        return Rules(self.patterns[:k] + own + self.patterns[k:], False, k, self.tracked, self.tracked_dirs)


def rules(exclude=(), include=(), *, defaults: bool = True) -> Rules:
    """The rules of a command: the built-in defaults, then (when the scan
    starts) the checkpoint's .wdiffignore, then every ``exclude`` pattern,
    then every ``include`` pattern, which wins over all of them."""
    base = tuple(compile_pattern(p) for p in DEFAULT_EXCLUDES) if defaults else ()
    extra = []
    for text, neg in [(p, False) for p in exclude] + [(p, True) for p in include]:
        if "\n" in text or "\r" in text:
            raise UsageError(f"pattern {text!r} holds a line break")
        p = compile_pattern(text, negate=neg)
        if p is None:
            raise UsageError(f"pattern {text!r} is empty or a comment")
        extra.append(p)
    return Rules(base + tuple(extra), True, len(base))


#: what every scan uses unless told otherwise
DEFAULT_RULES = rules()
#: every file is part of the checkpoint
NO_RULES = Rules((), False, 0)
