"""MkDocs hook: pages other developers are still writing are in the nav only once they exist.

A nav entry for a missing page fails the strict build; these few are dropped from the nav
while their file is absent, every other entry stays checked.
"""

from pathlib import Path

OPTIONAL = {"app/explorer.md", "app/models.md", "app/interventions.md", "checkpoints.md", "diagnose.md"}


def _prune(items, docs: Path):
    kept = []
    for item in items:
        if isinstance(item, dict):
            (title, value), = item.items()
            if isinstance(value, list):
                value = _prune(value, docs)
                if value:
                    kept.append({title: value})
                continue
            item = value
            if isinstance(value, str) and value in OPTIONAL and not (docs / value).is_file():
                continue
            kept.append({title: value})
        elif isinstance(item, str) and item in OPTIONAL and not (docs / item).is_file():
            continue
        else:
            kept.append(item)
    return kept


def on_config(config, **kwargs):
    if config.nav:
        config.nav = _prune(config.nav, Path(config.docs_dir))
    return config
