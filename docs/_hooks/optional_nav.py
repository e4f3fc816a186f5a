"""MkDocs hook: the nav tolerates pages other developers are still writing.

- A page named in the nav whose file does not exist (yet) is dropped from the nav, for the
  pages in OPTIONAL only: every other nav entry stays checked by the strict build.
- A page that exists but that the nav does not name is added to it, under "More", so a new
  page is reachable (and checked: its links, its code) before someone places it in the nav.
"""

from __future__ import annotations

OPTIONAL = {"app/explorer.md", "app/models.md", "app/interventions.md", "checkpoints.md", "diagnose.md",
            "distributed.md"}


def _prune(items, exists):
    kept = []
    for item in items:
        title, value = next(iter(item.items())) if isinstance(item, dict) else (None, item)
        if isinstance(value, list):
            value = _prune(value, exists)
            if value:
                kept.append({title: value})
            continue
        if isinstance(value, str) and value in OPTIONAL and not exists(value):
            continue
        kept.append(item)
    return kept


def _named(items) -> set[str]:
    named = set()
    for item in items:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        if isinstance(value, list):
            named |= _named(value)
        elif isinstance(value, str):
            named.add(value)
    return named


def on_files(files, config, **kwargs):
    nav = config.nav
    if not nav:
        return files
    pages = {f.src_uri for f in files.documentation_pages()}
    nav = _prune(nav, lambda uri: uri in pages)
    unlisted = sorted(pages - _named(nav))
    if unlisted:
        nav.append({"More": unlisted})
    config.nav = nav
    return files
