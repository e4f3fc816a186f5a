"""Griffe extension: the reST bits of our docstrings read as Markdown in the API reference.

The docstrings are Google style, as help() and an editor show them; a few reST habits ride
along, which mkdocstrings (Markdown) would print as they are:

- roles such as :class:`~workbench.ui.views.RunView` or :func:`workbench.watch` become code,
  `RunView` and `workbench.watch` (``~`` keeps the last name, as Sphinx does);
- a paragraph ending in ``::`` followed by an indented block becomes the paragraph and a
  fenced code block.
"""

from __future__ import annotations

import re
import textwrap

import griffe

ROLE = re.compile(r":(?:py:)?(?:class|meth|func|data|mod|attr|exc|obj|const)+:`(~?)([^`]+)`")


def _role(match: re.Match) -> str:
    short, target = match.groups()
    target = target.strip()
    if short:
        target = target.rsplit(".", 1)[-1]
    return f"`{target}`"


def _literal_blocks(text: str) -> str:
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.rstrip().endswith("::") and i + 2 < len(lines) and not lines[i + 1].strip():
            indent = len(line) - len(line.lstrip())
            j = i + 2
            block: list[str] = []
            while j < len(lines) and (not lines[j].strip() or len(lines[j]) - len(lines[j].lstrip()) > indent):
                block.append(lines[j])
                j += 1
            while block and not block[-1].strip():
                block.pop()
                j -= 1
            if block:
                head = line.rstrip()[:-2].rstrip()
                if head.strip():
                    out.append(head + ":")
                    out.append("")
                pad = " " * indent
                out.append(pad + "```")
                out.extend(pad + row if row.strip() else "" for row in textwrap.dedent("\n".join(block)).split("\n"))
                out.append(pad + "```")
                i = j
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


def rewrite(text: str) -> str:
    return _literal_blocks(ROLE.sub(_role, text))


class ReSTToMarkdown(griffe.Extension):
    def on_instance(self, *, obj: griffe.Object, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
