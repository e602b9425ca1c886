"""Turning raw model completions into compilable / runnable code."""

from __future__ import annotations

import re

_FENCE = re.compile(r"^\s*```", re.MULTILINE)


def _closing_brace(text: str) -> int | None:
    """Index of the ``}`` that closes a function body already opened before ``text``.

    Braces inside string/char literals and comments are ignored.
    """
    depth, i, n = 1, 0, len(text)
    while i < n:
        c = text[i]
        two = text[i : i + 2]
        if two == "//":
            j = text.find("\n", i)
            i = n if j < 0 else j
            continue
        if two == "/*":
            j = text.find("*/", i + 2)
            i = n if j < 0 else j + 2
            continue
        if c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j
        elif c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return None


def extract_c_body(completion: str) -> str:
    """Cut a completion of ``... f(args) {`` at the brace that closes the function.

    If the function never closes, the text before any markdown fence is kept
    and a closing brace is appended (the build then decides).  The result
    always ends with ``}`` and a newline.
    """
    end = _closing_brace(completion)
    if end is not None:
        return completion[: end + 1] + "\n"
    m = _FENCE.search(completion)
    body = completion[: m.start()] if m else completion
    return body.rstrip() + "\n}\n"


def c_body_closed(text: str) -> bool:
    """True once ``text`` (a body being generated) has closed the function: a stop test."""
    return _closing_brace(text) is not None


# Codex / HumanEval stop sequences: a new top-level statement ends the function.
PYTHON_STOP = ("\ndef ", "\nclass ", "\nif __name__", "\nprint(", "\n#", "\nassert ", '\n"""', "\n```")


def extract_python_body(completion: str) -> str:
    """Truncate a HumanEval completion at the first top-level stop sequence."""
    cut = min((i for s in PYTHON_STOP if (i := completion.find(s)) >= 0), default=len(completion))
    return completion[:cut]


