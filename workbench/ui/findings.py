"""The findings list as a view: what the run page and the Dashboard draw of a run's diagnoses.

Pure functions from a findings frame (:func:`workbench.diagnose.diagnose`, a
:class:`~workbench.diagnose.Diagnoser`'s ``findings()``) to what a front-end shows, plus the
focus action: which kind, site, statistic and steps the other views move to when a finding is
picked. :class:`RunFindings` keeps the live findings of one run beside its
:class:`~workbench.ui.views.RunView`, fed off the training thread.
"""

from __future__ import annotations

import html
import numbers
import re
import threading
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from workbench.diagnose import COLUMNS, SEVERITIES, Diagnoser, with_run_facts
from workbench.instrument.schema import site_name, whole_number
from workbench.ui.runs import breakable
from workbench.ui.views import RunView

__all__ = ["Focus", "MUTED", "RunFindings", "SHOWN_COLUMNS", "SHOWN_DATATYPES", "TABLE_COLUMNS",
           "during_interventions", "findings_html", "findings_summary", "findings_table", "focus", "fold_consequences",
           "mark_steps", "merge_calls", "option_label", "pick_key", "picked_row", "shown_findings"]

#: The columns of the list a page shows (one row per finding, as ordered: most severe, newest by last step, then
#: the first begun; a cause's consequences after it where they are listed: :func:`fold_consequences`).
#: ``consequences`` says how many a cause's row holds and whether they are listed, and of a consequence, its cause.
TABLE_COLUMNS = ["severity", "steps", "site", "finding", "evidence", "consequences"]
# (marks that common fonts draw: Debian's DejaVu has these, not ⛔)
_ICON = {"error": "✖", "warning": "⚠", "info": "ℹ"}
_COLOR = {"error": "#b42318", "warning": "#b54708", "info": "#175cd3"}
#: The colour of text said in passing (a hint, a prompt): JupyterLab's theme's second text colour, so that it
#: reads in a dark theme too (a fixed #555 was dark grey on black there); #555 where no theme sets it
MUTED = "var(--jp-content-font-color2, #555)"
#: the statistic a finding is best seen in, per finding
_STATISTIC = {"nan_origin": "nan_count", "dead_units": "zero_frac", "constant_output": "std", "saturated": "std",
              "vanishing_gradients": "norm", "exploding_gradients": "norm", "update_ratio_high": "norm",
              "update_ratio_low": "norm"}


def _steps(row: Any) -> str:
    return _steps_text(row.step, row.last_step)


def _steps_text(first: int, last: int) -> str:
    return f"{first}" if first == last else f"{first}–{last}"


#: What makes findings one where a module is called several times: the finding and where it is.
_WHERE = ["finding", "kind", "module", "tensor"]


def merge_calls(findings: pd.DataFrame, listed: Any = ()) -> pd.DataFrame:
    """The findings as the lists show them: one row per finding at a module called several times a step
    (an unrolled network, a layer shared by several paths) where the diagnosis found it at several of its
    calls over the same steps, in the place of the first of them. Its ``site`` names the calls
    (``act (calls 0–4)``), its steps span theirs, its severity is their worst and its evidence the lowest
    call's (``call 0: ...``), which ``call`` is. Every row gets ``calls`` and ``call_sites`` (the calls
    and their own site names: ``focus`` shows them all). Episodes of one call at different steps stay
    apart, as diagnosed, and so do a cause and its consequences (calls merge where their ``cause`` is the same).
    Findings grouped under a cause are folded under it (:func:`fold_consequences`:
    ``listed``, the causes whose consequences are listed after them)."""
    _check(findings)
    return fold_consequences(findings if "calls" in findings.columns else _merged_calls(findings), listed)


def _merged_calls(findings: pd.DataFrame) -> pd.DataFrame:
    """:func:`merge_calls` without folding the consequences."""
    calls = [(int(c),) for c in findings.call]
    names = [(str(s),) for s in findings.site]
    # (a cause is never merged with its consequences, nor consequences of one cause with another's: the cause's row
    # would be gone, its consequences naming a row no list has)
    where = [*_WHERE, "cause"] if "cause" in findings.columns else _WHERE
    repeated = (findings.kind != "metric") & findings.duplicated(subset=where, keep=False)
    if not repeated.any():
        return findings.assign(calls=calls, call_sites=names)
    rows = [dict(row, calls=c, call_sites=n) for row, c, n in zip(findings.to_dict("records"), calls, names)]
    groups: dict[tuple, list[int]] = {}
    for i in np.flatnonzero(repeated.to_numpy()):
        groups.setdefault(tuple(rows[i][k] for k in where), []).append(int(i))
    merged_away: set[int] = set()
    for members in groups.values():
        for episode in _overlapping(rows, members):
            by_call = sorted(episode, key=lambda i: rows[i]["call"])
            calls_here = [int(rows[i]["call"]) for i in by_call]
            if len(episode) < 2 or len(set(calls_here)) < len(calls_here):
                continue  # (a call twice: two of its episodes under another call's one - left as diagnosed)
            base, where = rows[by_call[0]], min(episode)
            rows[where] = dict(
                base, step=min(rows[i]["step"] for i in episode), last_step=max(rows[i]["last_step"] for i in episode),
                severity=max((rows[i]["severity"] for i in episode), key=SEVERITIES.index),
                site=(f"{site_name(base['module'], 0, base['tensor'], False, base['kind'])} "
                      f"(calls {_calls_text(tuple(calls_here))})"),
                evidence=f"call {base['call']}: {base['evidence']}", calls=tuple(calls_here),
                call_sites=tuple(str(rows[i]["site"]) for i in by_call))
            merged_away.update(i for i in episode if i != where)
    kept = [row for i, row in enumerate(rows) if i not in merged_away]
    # (of the frame's own class: a diagnose.Findings merged still displays its text whole, as the unmerged one does)
    return type(findings)(kept, columns=[*findings.columns, "calls", "call_sites"]).astype(findings.dtypes.to_dict())


def fold_consequences(findings: pd.DataFrame, listed: Any = ()) -> pd.DataFrame:
    """The findings as a list shows them, those grouped under a cause (a ``cause`` named: a diverging run's dead
    units, vanished gradients, stilled weights) folded under it: the list shows what went wrong, its first row the
    cause, not a row per consequence (:func:`workbench.diagnose.diagnose` keeps them all; a cause's row counts them
    in its ``consequences`` column, and its evidence names each, with its steps). The consequences of a cause in
    ``listed`` follow its row, each a finding to pick like any other (a page lists them when its cause is picked, and
    folds them when it is picked again: :func:`toggled`, which keeps ``listed``). Where one cause at one site began
    two troubles, each row holds the consequences that began from its step on, before the next's.

    Every row gets ``folded``: how many consequences its row holds (0 but for a cause; as its ``consequences``
    column and its evidence count them, a finding at each call of a module, where its calls' rows were merged into
    one by :func:`merge_calls`), ``listed``: whether
    they follow it, and ``trouble_steps``: of a cause, the steps from its first to the last any of its consequences
    held (``1–40`` where its own are ``1–4``), "" for another row."""
    if "folded" in findings.columns:
        return findings
    listed = set(listed)
    unfolded = dict(folded=0, listed=False, trouble_steps="")
    if "cause" not in findings.columns or not (findings.cause != "").any():
        return findings.assign(**unfolded)
    kept = findings[findings.cause == ""].reset_index(drop=True).assign(**unfolded)
    causes = kept.consequences > 0 if "consequences" in kept.columns else pd.Series(False, index=kept.index)
    after: dict[int, pd.DataFrame] = {}
    for cause, members in findings[findings.cause != ""].groupby("cause", sort=False):
        roots = [int(i) for i in np.flatnonzero(causes.to_numpy()) if cause in
                 {f"{kept.finding[i]} at {s}" for s in (kept.call_sites[i] if "call_sites" in kept.columns
                                                        else (kept.site[i],))}]
        if not roots:  # (a cause not in the list: its consequences are findings of their own, after the rest)
            kept = pd.concat([kept, members.assign(**unfolded)], ignore_index=True)
            continue
        # (one cause at one site may begin two troubles, each grouped on its own (update ratios too high at steps
        # 1-3, and again from step 300): a consequence is that of the one begun last at or before it)
        owners = [max((i for i in roots if kept.step[i] <= step), key=lambda i: kept.step[i], default=roots[0])
                  for step in members.step]
        for i in roots:
            own_members = members[[owner == i for owner in owners]]
            if own_members.empty:
                continue
            # (the findings diagnosed, as the cause's evidence counts and names them: a row of a module's calls
            # merged (:func:`merge_calls`) holds one a call)
            kept.loc[i, "folded"] = (sum(len(c) for c in own_members.calls) if "calls" in own_members.columns
                                     else len(own_members))
            kept.loc[i, "trouble_steps"] = _steps_text(int(kept.step[i]), max(int(kept.last_step[i]),
                                                                              int(own_members.last_step.max())))
            if pick_key(kept.iloc[i]) in listed:
                kept.loc[i, "listed"] = True
                after[i] = own_members.assign(**unfolded)
    if not any(len(rows) for rows in after.values()):
        return kept
    parts = []
    for i in range(len(kept)):
        parts += [kept.iloc[[i]]] + ([after[i]] if i in after and len(after[i]) else [])
    return pd.concat(parts, ignore_index=True).astype(kept.dtypes.to_dict())


def toggled(listed: Any, row: Any) -> tuple:
    """``listed`` (the causes whose consequences a list shows: :func:`fold_consequences`) after ``row`` was picked:
    a cause with consequences folded under it has them listed, one listed has them folded again; any other
    row leaves it as it was."""
    listed = tuple(listed)
    if not getattr(row, "folded", 0):
        return listed
    key = pick_key(row)  # (one cause at one site may begin two troubles, each with its own consequences)
    return tuple(k for k in listed if k != key) if key in listed else (*listed, key)


def _overlapping(rows: list[dict], members: list[int]) -> list[list[int]]:
    """``members`` (indices into ``rows``) grouped where their steps overlap, one after another."""
    episodes: list[list[int]] = []
    end = None
    for i in sorted(members, key=lambda i: rows[i]["step"]):
        if end is None or rows[i]["step"] > end:
            episodes.append([])
            end = rows[i]["last_step"]
        episodes[-1].append(i)
        end = max(end, rows[i]["last_step"])
    return episodes


def pick_key(row: Any) -> tuple:
    """What a pick remembers of a finding to find it again in a later list (:func:`picked_row`): the finding,
    where it is (a merged finding's site names more calls as they join it) and the step its episode began (one
    finding at one site may hold twice, a row each; a cause and its consequences may come back)."""
    return (row.finding, row.kind, row.module, row.tensor, row.site if row.kind == "metric" else "", int(row.step))


def picked_row(frame: pd.DataFrame, picked: tuple | None) -> int | None:
    """The position in ``frame`` of the finding ``picked`` (its :func:`pick_key` in an earlier list), or None where
    it is not listed. A row of the same finding whose steps take in the step the pick began is it too: a module's
    call that began earlier joined its merged finding (:func:`merge_calls`), whose first step moved back; the
    episodes of one finding at one site do not overlap, so that row is the only one."""
    if picked is None or frame.empty:
        return None
    keys = [pick_key(row) for row in frame.itertuples()]
    if picked in keys:
        return keys.index(picked)
    *finding, step = picked
    return next((i for i, (key, last_step) in enumerate(zip(keys, frame.last_step))
                 if list(key[:-1]) == finding and key[-1] <= step <= last_step), None)


def _calls_text(calls: tuple[int, ...], most: int = 6) -> str:
    """``0–4``, ``0, 3, 6, 9, 12``: runs of three or more consecutive calls as a span; past ``most`` parts,
    how many calls in all."""
    parts, start = [], 0
    for i in range(1, len(calls) + 1):
        if i == len(calls) or calls[i] != calls[i - 1] + 1:
            run = calls[start:i]
            parts += [f"{run[0]}–{run[-1]}"] if len(run) >= 3 else [str(c) for c in run]
            start = i
    return ", ".join(parts) if len(parts) <= most else f"{', '.join(parts[:most])} … ({len(calls)} calls)"


def finding_detail(row: Any) -> str:
    """One finding in Markdown: what, where, since when, the whole evidence and the hint."""
    return (f"{_ICON[row.severity]} **{row.finding}** at `{row.site}`, step {_steps(row)}: {row.evidence}\n\n"
            f"*What to try:* {row.hint}")


def during_interventions(findings: pd.DataFrame, interventions: pd.DataFrame | None) -> pd.DataFrame:
    """The findings with the interventions on while each held named at the start of its evidence
    (``While i1 zero units [0, 1, 2, 3, 4, ... 31] (32 of them) at layers.1 (from step 110, still on) was
    on: ...``) and in a column ``interventions`` (their ids, "" for none): what a diagnosis sees then may be
    the intervention's doing (zeroed units read as dead, the gradients below them vanish), not the model's.
    ``interventions`` is the run page's table (``id, site, intervention, from step, to step``; no last step
    while one is on)."""
    _check(findings)
    if interventions is None or not len(interventions) or findings.empty:
        return findings.assign(interventions="") if "interventions" not in findings.columns else findings
    spans = []
    for _, row in interventions.iterrows():
        start, end = int(row["from step"]), None if row["to step"] == "" else int(row["to step"])
        if end is not None and end < start:
            continue  # (removed before the step it was to start at: never on)
        when = f"from step {start}, still on" if end is None else f"steps {start}–{end}"
        spans.append((row["id"], f"{row['id']} {row['intervention']} at {row['site']} ({when})", start, end))
    evidence, ids = [], []
    for row in findings.itertuples():
        on = [(i, text) for i, text, start, end in spans
              if start <= row.last_step and (end is None or row.step <= end)]
        ids.append(", ".join(i for i, _ in on))
        evidence.append(f"While {'; '.join(text for _, text in on)} {'was' if len(on) == 1 else 'were'} on: "
                        f"{row.evidence}" if on else row.evidence)
    return findings.assign(evidence=evidence, interventions=ids)


def consequences_note(row: Any) -> str:
    """What a row says of the consequences (:func:`fold_consequences`): a cause's
    ``+13 consequences over steps 1–40 (pick to list)`` (``13 consequences over steps 1–40 below (pick to fold)``),
    the steps from its first to the last any of them held, where past its own; a consequence's
    ``↳ consequence of update_ratio_high at 0``; "" for another finding."""
    folded = int(getattr(row, "folded", 0) or 0)
    if folded:
        plural = "s" if folded > 1 else ""
        span = getattr(row, "trouble_steps", "")
        # (the steps of the whole trouble, where they reach past the cause's own)
        over = f" over {'steps' if '–' in span else 'step'} {span}" if span and span != _steps(row) else ""
        return (f"{folded} consequence{plural}{over} below (pick to fold)" if getattr(row, "listed", False)
                else f"+{folded} consequence{plural}{over} (pick to list)")
    cause = getattr(row, "cause", "")
    return f"↳ consequence of {cause}" if isinstance(cause, str) and cause else ""


def findings_table(findings: pd.DataFrame, limit: int = 50) -> pd.DataFrame:
    """The list as a table (:data:`TABLE_COLUMNS`): a severity mark and word, the steps it held
    (``first–last``), the site, the finding, its whole evidence (the numbers that made it fire:
    a page wraps it; :func:`finding_detail` adds the hint) and what it says of consequences
    (:func:`consequences_note`); at most ``limit`` rows."""
    _check(findings)
    limit = whole_number("limit", limit, 1, "a positive int (rows shown)")
    if findings.empty:
        return pd.DataFrame(columns=TABLE_COLUMNS)
    shown = findings.head(limit)
    return pd.DataFrame({
        "severity": [f"{_ICON[s]} {s}" for s in shown.severity],
        "steps": [_steps(r) for r in shown.itertuples()],
        "site": shown.site.to_list(),
        "finding": shown.finding.to_list(),
        "evidence": shown.evidence.to_list(),
        "consequences": [consequences_note(r) for r in shown.itertuples()],
    }, columns=TABLE_COLUMNS)


#: Where a name in the list (a site, one named in the evidence) may break over two lines: after a dot or an
#: underscore between two letters or digits, not inside a number (``model.`` ``wte.`` ``weight``, ``0.1514``).
_NAME_JOINT = re.compile(r"(?<=[A-Za-z0-9][._])(?=[A-Za-z0-9])(?!(?<=\d[._])\d)")
#: The columns of the list as a page shows it (:func:`shown_findings`): what was found, where and when, one
#: item a line, and its evidence, which takes the rest of the width: five columns of a word each left the
#: evidence under a third of it, a long one a column of a word or two a line, taller than the list.
SHOWN_COLUMNS = ["finding", "evidence"]
#: The cells of the list a page shows as HTML (:func:`shown_findings`), in the order of :data:`SHOWN_COLUMNS`.
SHOWN_DATATYPES = ["html", "html"]


def _breakable(text: Any) -> str:
    return breakable(text, _NAME_JOINT)


def _shown_finding(text: str) -> str:
    """A cell of the shown list's ``finding`` column as HTML: its severity and steps, the finding's name
    in bold and the site (which may break after its dots), one a line; then what it says of consequences
    in italics, if anything."""
    head, name, site, *consequences = text.split("\n")
    said = "".join(f"<br><i>{_breakable(line)}</i>" for line in consequences if line)
    return (f"{html.escape(head, quote=False)}<br><b>{_breakable(name)}</b><br>"
            f"<span>{_breakable(site)}</span>{said}")


def shown_findings(table: pd.DataFrame) -> Any:
    """The list as a page shows it (:data:`SHOWN_COLUMNS`): ``table`` (:func:`findings_table`) as a pandas
    ``Styler`` of two columns, the severity, steps, finding and site of each row over three lines of its
    first (``✖ error · steps 3–8`` / **nan_origin** / ``layers.2``; ``step 3`` for one step) and the
    evidence beside them; a name (a site, one in the evidence) may break over two lines after its dots and
    underscores, not mid-word.
    The cells' values (what a copy of the table takes) are the same text, its lines split by newlines.
    An empty table is returned with the shown columns."""
    if table.empty:
        return pd.DataFrame(columns=SHOWN_COLUMNS)
    said = [n if isinstance(n, str) else "" for n in (table.consequences if "consequences" in table.columns
                                                      else [""] * len(table))]
    finding = [f"{severity} · {'steps' if '–' in steps else 'step'} {steps}\n{name}\n{site}" + (f"\n{note}" if note
                                                                                               else "")
               for severity, steps, name, site, note in zip(table.severity, table.steps, table.finding, table.site,
                                                           said)]
    shown = pd.DataFrame({"finding": finding, "evidence": table.evidence.to_list()}, columns=SHOWN_COLUMNS)
    return shown.style.format({"finding": _shown_finding, "evidence": _breakable})


def findings_summary(findings: pd.DataFrame, running: bool = True, steps: int | None = None) -> str:
    """One line of Markdown above the list: how many findings of each severity, or none. ``steps``: how many
    steps were diagnosed, where known; with none, nothing was judged, and the line says so rather than that
    nothing looked wrong."""
    _check(findings)
    if findings.empty and steps == 0:
        return ("**Diagnoses:** no step recorded yet." if running
                else "**Diagnoses:** none: this run recorded no step.")
    if findings.empty:
        return ("**Diagnoses:** nothing looks wrong so far." if running
                else "**Diagnoses:** nothing looked wrong in this run.")
    own = findings[findings.cause == ""] if "cause" in findings.columns else findings
    counts = own.severity.value_counts()
    parts = [f"{_ICON[s]} {counts[s]} {s}{'s' if counts[s] > 1 else ''}" for s in ("error", "warning", "info")
             if s in counts]
    # (the consequences grouped under a cause: their count, and whether the list shows them: fold_consequences)
    folded = int(findings.folded.sum()) if "folded" in findings.columns else 0
    if folded:
        causes = int((findings.folded > 0).sum())
        hidden = int(findings.folded[~findings.listed.astype(bool)].sum())
        its = "its row" if causes == 1 else "their causes' rows"
        parts[-1] += (f", and {folded} consequence{'s' if folded > 1 else ''} of {'it' if causes == 1 else 'them'} "
                      + (f"folded under {its} (pick {'it' if causes == 1 else 'one'} to list them)" if hidden == folded
                         else f"listed under {its}" if not hidden else f"{hidden} of them folded"))
    during = int((findings.interventions != "").sum()) if "interventions" in findings.columns else 0
    intervened = (f" {during} of them held while an intervention was on: they may be its doing (see their "
                  "evidence)." if during else "")
    return f"**Diagnoses:** {', '.join(parts)}.{intervened} Pick one to show its site and steps in the views."


def option_label(row: Any) -> str:
    """A finding in one line, for a list a person picks from."""
    said = consequences_note(row)
    if said.startswith("↳"):
        return f"↳ {_ICON[row.severity]} {row.finding} at {row.site}, step {_steps(row)}"
    return f"{_ICON[row.severity]} {row.finding} at {row.site}, step {_steps(row)}" + (
        f" · {said.split(' (')[0]}" if said else "")


def finding_html(row: Any) -> str:
    """One finding in HTML (the notebook's detail of the pick): what, where, since when, the
    whole evidence and the hint."""
    return (f"<div style='margin:.2em 0'><b style='color:{_COLOR[row.severity]}'>{_ICON[row.severity]} "
            f"{html.escape(row.finding)}</b> at <code>{html.escape(str(row.site))}</code>, step {_steps(row)}: "
            f"{html.escape(row.evidence)}<br><span style='color:{MUTED}'><i>What to try:</i> "
            f"{html.escape(row.hint)}</span></div>")


def findings_html(findings: pd.DataFrame, limit: int = 50) -> str:
    """The list as HTML (the notebook's): each finding's severity, steps, site, evidence and hint."""
    _check(findings)
    if findings.empty:
        return ""
    items = []
    for row in findings.head(limit).itertuples():
        items.append(
            f"<li style='margin:0 0 .4em 0'><b style='color:{_COLOR[row.severity]}'>{_ICON[row.severity]} "
            f"{html.escape(row.finding)}</b> at <code>{html.escape(str(row.site))}</code>, step {_steps(row)}: "
            f"{html.escape(row.evidence)}<br><span style='color:{MUTED}'><i>Hint:</i> {html.escape(row.hint)}"
            f"</span>{''.join(f'<br><i>{html.escape(n)}</i>' for n in [consequences_note(row)] if n)}</li>")
    more = f"<li>… and {len(findings) - limit} more</li>" if len(findings) > limit else ""
    return f"<ol style='padding-left:1.4em;margin:.2em 0'>{''.join(items)}{more}</ol>"


@dataclass(frozen=True)
class Focus:
    """Where the views go for a finding: the kind and site (a name of the run's views), the
    statistic to show, the steps it held, or the metric (for a metric's finding); ``sites``: the
    site and the others of a finding merged over a module's calls (:func:`merge_calls`)."""

    kind: str | None
    site: str | None
    statistic: str | None
    step: int
    last_step: int
    metric: str | None = None
    sites: tuple[str, ...] = ()  # every call site of the finding (a module's calls, :func:`merge_calls`)


def focus(findings: pd.DataFrame, index: int, view: Any = None) -> Focus:
    """The focus of the ``index``-th finding (its row in ``findings``).

    Args:
        findings: a findings frame.
        index: the row picked (0: the first shown).
        view: the run's :class:`~workbench.ui.views.RunView`: the site is named as its views name
            it (a container's output is shown under the innermost site that returned it).

    Raises:
        IndexError: no such row (the list changed since it was drawn: pick again).
    """
    _check(findings)
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, numbers.Integral) \
            or not 0 <= index < len(findings):
        if not len(findings):  # (not "the list has 0 (0 to -1)")
            raise IndexError(f"No finding number {index!r}: the list is empty: nothing looks wrong in the steps "
                             "so far.")
        raise IndexError(f"No finding number {index!r}: the list has {len(findings)} (0 to {len(findings) - 1}); "
                         "it may have changed since it was drawn - pick again.")
    row = findings.iloc[int(index)]
    step, last = int(row.step), int(row.last_step)
    if row.kind == "metric":
        return Focus(None, None, None, step, last, metric=str(row.site))
    kind = "param" if row.kind == "update" else str(row.kind)
    statistic = _STATISTIC.get(row.finding, "norm")
    merged = "call_sites" in findings.columns
    pairs = list(zip(row.calls, row.call_sites)) if merged else [(int(row.call), str(row.site))]
    if view is not None and kind in getattr(view, "sites", {}):
        table = view.site_table(kind)
        sites = tuple(dict.fromkeys(_view_site(table, row.module, row.tensor, call, name) for call, name in pairs))
    else:
        sites = tuple(name for _, name in pairs)
    site = sites[0]
    return Focus(kind, site, statistic, step, last, sites=sites)


def _view_site(table: pd.DataFrame, module: str, tensor: str, call: int, name: str) -> str:
    """The name the views give the call ``call`` of ``module``'s ``tensor`` (named ``name`` by the
    diagnosis): a container's output is shown under the innermost site that returned it."""
    match = table[(table.module == module) & (table.tensor == tensor)]
    exact = match[match.call == call]
    match = exact if len(exact) else match
    if len(match):
        return str(match.name.iloc[0])
    alias = table[table.aliases.str.split(", ").apply(lambda names: name in names)]
    return str(alias.name.iloc[0]) if len(alias) else name


def mark_steps(figure: dict[str, Any], step: int, last_step: int, color: str = "#d62728") -> dict[str, Any]:
    """``figure`` (a Plotly spec over steps) with the steps a finding held shaded (a line for one step)."""
    layout = dict(figure.get("layout", {}))
    shapes = list(layout.get("shapes", []))
    # every panel of the figure (a metrics figure has one x axis per metric: xaxis, xaxis2 ...)
    axes = sorted((key for key in layout if key.startswith("xaxis")), key=lambda k: int(k[5:] or 1)) or ["xaxis"]
    for axis in axes:
        xref, yref = "x" + axis[5:], "y" + axis[5:] + " domain"
        if step == last_step:
            shapes.append({"type": "line", "xref": xref, "yref": yref, "x0": step, "x1": step, "y0": 0, "y1": 1,
                           "line": {"color": color, "width": 2, "dash": "dot"}})
        else:
            shapes.append({"type": "rect", "xref": xref, "yref": yref, "x0": step, "x1": last_step, "y0": 0, "y1": 1,
                           "fillcolor": color, "opacity": 0.12, "line": {"width": 0}, "layer": "below"})
    layout["shapes"] = shapes
    return {**figure, "layout": layout}


#: The columns a findings frame must have: ``cause`` may be missing (a frame drawn before it was one: none grouped).
_REQUIRED = [c for c in COLUMNS if c not in ("cause", "consequences")]


def _check(findings: Any) -> None:
    if not isinstance(findings, pd.DataFrame) or not set(_REQUIRED) <= set(findings.columns):
        raise TypeError("Expected a findings frame (workbench.diagnose.diagnose(...) or a Diagnoser's findings()), "
                        f"with the columns {_REQUIRED}; got {type(findings).__name__}.")


class RunFindings:
    """The live findings of one run: a :class:`~workbench.diagnose.Diagnoser` fed the run's
    recorded steps on a subscriber's thread (never the training's), read by the page's tick.
    ``frame()`` recomputes only when new steps arrived.

    Args:
        source: a ``Watch`` (followed from its first recorded step), a stored ``Run`` or None (nothing:
            the caller feeds ``diagnoser``).
        metadata: the run's metadata where ``source`` is None (a watch's and a run's are their own): its
            ``chance`` is the chance level of the loss (:func:`workbench.diagnose.with_run_facts`).
    """

    def __init__(self, source: Any = None, metadata: dict[str, Any] | None = None) -> None:
        from workbench.instrument import Run

        # (the run's own facts: the chance level of its loss, which a classification experiment records)
        facts = getattr(source, "metadata", None) if source is not None else metadata
        self.diagnoser = Diagnoser(**with_run_facts(facts, None, {}))
        self._lock = threading.Lock()
        self._frame: pd.DataFrame = _merged_calls(self.diagnoser.findings())  # (consequences not yet folded)
        self._seen = -1
        self.error: str | None = None
        if isinstance(source, Run):  # (a part at a time: a long run's rows at once took gigabytes)
            metrics = source.metrics(long=True)
            for first, last in source.step_ranges(RunView.READ_STEPS):
                self.diagnoser.feed_frame(source.to_pandas(steps=(first, last)),
                                          metrics[(metrics.step >= first) & (metrics.step <= last)])
        elif source is not None:
            if getattr(source, "closed", False):
                self.diagnoser.feed(source.recorder.records())
            else:
                self.diagnoser.attach(source)

    def frame(self, listed: Any = ()) -> pd.DataFrame:
        """The findings now as a list shows them (the last good ones, with ``error`` set, should diagnosing fail):
        :func:`merge_calls`, the consequences of the causes in ``listed`` listed after them."""
        with self._lock:
            received = self.diagnoser.received
            if received != self._seen:
                try:
                    self._frame = _merged_calls(self.diagnoser.findings())
                    self.error = None
                except Exception as exc:  # a diagnosis never takes the page or the training down
                    self.error = f"{type(exc).__name__}: {exc}"
                self._seen = received
            return fold_consequences(self._frame, listed)

    @property
    def fed(self) -> int:
        """Steps received so far (taken in or queued): a page redraws the list when it changes."""
        return self.diagnoser.received

    def flush(self, timeout: float | None = 10.0) -> bool:
        """Wait until the steps the watch has recorded reached the diagnoser (a run's end)."""
        return self.diagnoser.flush(timeout)

    def close(self) -> None:
        self.diagnoser.detach()


# ---------------------------------------------------------------------- the Gradio run page
def run_findings(run: Any) -> RunFindings | None:
    """The findings of a live run of the app (a ``LiveRun``, which follows them from its first
    step); None for no run."""
    return None if run is None else run.findings


def page_findings(run: Any, state: dict) -> tuple:
    """The run page's findings: ``(summary markdown, table)``, each ``gr.skip()`` when the page
    has it already (``state`` remembers what was sent)."""
    import gradio as gr

    note, table = _page_note(run, state)
    sent = state.setdefault("findings", {})
    rows = table.values.tolist()
    out = (gr.skip() if sent.get("note") == note else note, gr.skip() if sent.get("rows") == rows else table)
    sent.update(note=note, rows=rows)
    return out


def _page_note(run: Any, state: dict) -> tuple[str, pd.DataFrame]:
    """The note above the page's list (the summary, and the finding picked last in full) and the list."""
    found = run_findings(run)
    if found is None:
        return "", pd.DataFrame(columns=TABLE_COLUMNS)
    running = bool(getattr(run, "running", False))
    if not running:
        found.flush(timeout=2.0)  # (an ended run: its last steps, before the page's last tick draws them)
    frame = during_interventions(found.frame(state.get("findings_listed", ())), run.intervention_frame())
    note = findings_summary(frame, running=running, steps=found.fed)
    if found.error:
        note += f" Diagnosing failed: `{found.error}`."
    picked = picked_row(frame, state.get("findings_pick"))
    if picked is not None:
        note += "\n\n" + finding_detail(frame.iloc[picked])
    return note, findings_table(frame)


def page_table(table: Any) -> Any:
    """The update of a page's findings list for ``table`` (:func:`findings_table`; ``gr.skip()`` passes): the
    list as :func:`shown_findings` draws it, hidden while it has no row (the note above it says that nothing
    looks wrong)."""
    import gradio as gr

    if not isinstance(table, pd.DataFrame):
        return table
    return gr.Dataframe(value=shown_findings(table), visible=not table.empty)


def focus_page(run: Any, run_id: Any, header: str, state: dict | None, values: Any, index: int,
               interventions: pd.DataFrame | None = None) -> tuple:
    """The run page's views focused on its ``index``-th finding, as the page's redraw returns them
    (``(page state, *updates of VIEW_OUTPUTS)``), then the note above the list with the finding in
    full, the statistic picker: its kind and site (alone) in the statistic it is seen in per
    site, the distributions and the heatmap, or its metric alone; the steps it held shaded; then the list,
    a cause's consequences listed under it (folded again when it is picked again: :func:`toggled`)."""
    import gradio as gr

    from workbench.ui import run_page

    state = dict(state or run_page.new_page_state())
    found = run_findings(run)
    if found is None:
        return *run_page.redraw(None, header, run_id, state, values), "", gr.skip(), gr.skip()
    frame = found.frame(state.get("findings_listed", ()))
    if 0 <= index < len(frame):
        state["findings_listed"] = toggled(state.get("findings_listed", ()), frame.iloc[index])
        frame = found.frame(state["findings_listed"])  # (the cause's row stays where it was: its own after it)
    state["findings_pick"] = pick_key(frame.iloc[index]) if 0 <= index < len(frame) else None
    note, table = _page_note(run, state)
    sent = state["findings"] = dict(state.get("findings", {}))
    rows = table.values.tolist()
    shown = gr.skip() if sent.get("rows") == rows else page_table(table)
    sent.update(note=note, rows=rows)
    return *_focused(run.view, frame, run_id, header, state, values, index, interventions, note), shown


def _focused(view: Any, frame: pd.DataFrame, run_id: Any, header: str, state: dict, values: Any, index: int,
             interventions: pd.DataFrame | None, note: str) -> tuple:
    """A run page's views (``view``) focused on the ``index``-th finding of ``frame``: ``(page state,
    *updates of VIEW_OUTPUTS, note, statistic)``."""
    from workbench.ui import run_page

    target = focus(frame, int(index), view)
    controls = run_page.page_controls(state, values)
    if target.metric is not None:
        controls = replace(controls, metrics=[target.metric])
        state["auto_metrics"] = False
    else:
        controls = replace(controls, kind=target.kind, statistic=target.statistic, sites=list(target.sites),
                           dist_site=target.site, heat_kind=target.kind)
        state["auto_sites"] = False
    recording = run_page.recording_of(run_id, view)
    controls = run_page.with_kept_scales(controls, state, recording)  # (the metrics' panels as the ticks draw them)
    state["site_colors"] = colors = dict(state.get("site_colors") or {})  # (a site keeps its colour)
    page = run_page.draw_page(view, controls, header=header, interventions=interventions, site_colors=colors)
    page = replace(page, sites_figure=mark_steps(page.sites_figure, target.step, target.last_step),
                   metrics_figure=mark_steps(page.metrics_figure, target.step, target.last_step))
    # drawn at these steps: the next tick redraws (without the shading) only when new steps arrive
    state["version"] = (recording, view.steps_fed, view.status, view.dropped)
    return state, *run_page.page_outputs(page, state, controls, revision=recording), note, controls.statistic


def select_handler(manager: Any) -> Any:
    """The run page's handler of a click on its findings list: ``(live run id, page state,
    *controls, event) -> focus_page(...)``, with the signature Gradio reads to pass the event."""
    import inspect

    import gradio as gr

    from workbench.ui import run_page
    from workbench.ui.run_tabs import NO_RUN

    def on_finding(attached, state, *rest):
        *values, event = rest  # (Gradio passes the event after the inputs)
        run = manager.get(attached) if attached else None
        if run is None:
            return *run_page.redraw(None, NO_RUN, attached, state, values), "", gr.skip(), gr.skip()
        return focus_page(run, attached, run_page.live_header(run), state, values, event.index[0],
                          run.intervention_frame())

    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    on_finding.__signature__ = inspect.Signature(
        [inspect.Parameter(name, positional) for name in ("attached", "state", *run_page.CONTROLS)]
        + [inspect.Parameter("event", positional, annotation=gr.SelectData)])
    on_finding.__annotations__ = {"event": gr.SelectData}  # (a real class: Gradio passes the event by it)
    return on_finding


# ---------------------------------------------------------------------- the Runs tab (stored runs)
_STORED: dict[tuple, pd.DataFrame] = {}  # (run directory, steps, status, start time) -> its findings (a few kept)
_STORED_LOCK = threading.Lock()


def stored_frame(run: Any, listed: Any = ()) -> pd.DataFrame:
    """The findings of a stored run (``Run.diagnose()``) as a list shows them, the consequences of the causes in
    ``listed`` listed (:func:`merge_calls`); read again only when it grew or ended, or was recorded again at its path
    (as many steps and ended alike: its start time tells, as the views' ``ViewCache``)."""

    key = (str(run.path), len(run.steps), run.status, run.metadata.get("start_time"))
    with _STORED_LOCK:
        found = _STORED.get(key)
    if found is None:
        found = _merged_calls(run.diagnose())
        with _STORED_LOCK:
            _STORED[key] = found
            while len(_STORED) > 8:
                _STORED.pop(next(iter(_STORED)))
    return fold_consequences(found, listed)


def stored_findings(cache: Any, pick: Any, listed: Any = ()) -> tuple[str, pd.DataFrame]:
    """The Runs tab's findings of the stored run ``pick`` (through the app's ``ViewCache``):
    ``(note, table)``, the consequences of the causes in ``listed`` listed (:func:`fold_consequences`);
    empty while no run is open."""
    if not pick:
        return "", pd.DataFrame(columns=TABLE_COLUMNS)
    _view, run, message = cache.get(pick)
    if run is None:
        return "", pd.DataFrame(columns=TABLE_COLUMNS)
    from workbench.ui.stored_runs import stored_interventions

    frame = during_interventions(stored_frame(run, listed), stored_interventions(run))
    return findings_summary(frame, running=False, steps=len(run.steps)), findings_table(frame)


def stored_select_handler(cache: Any, find: Any) -> Any:
    """The Runs tab's handler of a click on its findings list: ``(run name, page state, *controls,
    event)`` -> the replayed views focused on that finding, the note with it in full, the statistic, the list
    (a cause's consequences listed under it, or folded again: :func:`toggled`)."""
    import inspect

    import gradio as gr

    from workbench.ui import run_page

    def on_finding(pick, state, *rest):
        *values, event = rest  # (Gradio passes the event after the inputs)
        state = dict(state or run_page.new_page_state())
        view, header, *more = find(pick)
        _v, run, _message = cache.get(pick) if pick else (None, None, "")
        if view is None or run is None:
            return *run_page.redraw(None, header, pick, state, values), "", gr.skip(), gr.skip()
        interventions = more[0] if more else None
        index = event.index[0]
        listed = state.get("findings_listed", ())
        shown = stored_frame(run, listed)
        if 0 <= index < len(shown):
            state["findings_listed"] = listed = toggled(listed, shown.iloc[index])
        frame = during_interventions(stored_frame(run, listed), interventions)
        note = findings_summary(frame, running=False, steps=len(run.steps))
        if 0 <= index < len(frame):
            note += "\n\n" + finding_detail(frame.iloc[index])
        return *_focused(view, frame, pick, header, state, values, index, interventions, note), \
            page_table(findings_table(frame))

    positional = inspect.Parameter.POSITIONAL_OR_KEYWORD
    on_finding.__signature__ = inspect.Signature(
        [inspect.Parameter(name, positional) for name in ("pick", "state", *run_page.CONTROLS)]
        + [inspect.Parameter("event", positional, annotation=gr.SelectData)])
    on_finding.__annotations__ = {"event": gr.SelectData}  # (a real class: Gradio passes the event by it)
    return on_finding
