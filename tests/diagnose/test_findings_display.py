"""A findings frame shows its text whole where a person reads it (a notebook's table, print), and stays a pandas
DataFrame for code."""

from __future__ import annotations

import html
import re

import pandas as pd
import torch
from IPython.core.formatters import DisplayFormatter

import workbench
from workbench.diagnose import Findings

from tests.diagnose.conftest import mlp, train


def dead_relu_findings(tmp_path) -> tuple[pd.DataFrame, workbench.Watch]:
    model = mlp("relu")
    with torch.no_grad():
        model.layers[0].bias.fill_(-20.0)  # every unit of layers.1 dead
    w = train(model, steps=4, store=tmp_path / "run")
    findings = w.diagnose()
    assert "dead_units" in set(findings.finding)
    return findings, w


def test_a_notebook_and_print_show_the_evidence_and_hint_of_each_finding_whole(tmp_path):
    findings, _ = dead_relu_findings(tmp_path)
    cut_at = pd.get_option("display.max_colwidth")
    texts = [*findings.evidence, *findings.hint]
    assert all(len(text) > cut_at for text in texts), "texts pandas would cut, or this test proves nothing"
    plain = pd.DataFrame(findings)._repr_html_()  # (pandas' own table, for the sake of comparison)
    assert not any(html.escape(text, quote=False) in plain for text in texts)
    shown, _ = DisplayFormatter().format(findings)  # what Jupyter shows of a cell's last line
    for text in texts:
        assert html.escape(text, quote=False) in shown["text/html"]
        assert text in shown["text/plain"]
        assert text in str(findings)
    assert 'class="dataframe workbench-findings"' in shown["text/html"]  # (its text left-aligned and wrapped)
    headers = re.findall(r"<th( style=\"[^\"]*\")?>([a-z_]+)</th>", shown["text/html"])
    assert [name for _, name in headers] == list(findings.columns)  # every column, none elided
    assert {name: style for style, name in headers if style} == dict.fromkeys(
        ["evidence", "hint"], ' style="min-width: 22em;"')  # (a line of a few words each, not a word a line)
    assert all(column in shown["text/plain"] for column in findings.columns)


def test_what_code_takes_of_a_findings_frame_is_a_dataframe_shown_whole_too(tmp_path):
    findings, w = dead_relu_findings(tmp_path)
    assert isinstance(findings, pd.DataFrame) and isinstance(findings, Findings)
    dead = findings[findings.finding == "dead_units"]
    assert isinstance(dead, Findings) and len(dead) == 1
    assert dead.evidence.iloc[0] in repr(dead)
    assert html.escape(dead.hint.iloc[0], quote=False) in dead._repr_html_()
    assert list(findings[["site", "finding"]].columns) == ["site", "finding"]
    assert dead.iloc[0].finding == "dead_units"  # (a row is a Series, as of any frame)
    stored = workbench.load_run(tmp_path / "run").diagnose()
    assert isinstance(stored, Findings)
    pd.testing.assert_frame_equal(stored, findings)
    findings.to_csv(tmp_path / "findings.csv", index=False)
    read = pd.read_csv(tmp_path / "findings.csv", keep_default_na=False)
    assert read.evidence.tolist() == findings.evidence.tolist()
    assert read.finding.tolist() == findings.finding.tolist()


def test_the_text_of_a_long_findings_frame_shows_the_rows_pandas_shows(tmp_path):
    findings, _ = dead_relu_findings(tmp_path)
    many = pd.concat([findings] * 20, ignore_index=True)
    with pd.option_context("display.max_rows", 10, "display.min_rows", 4):
        text = repr(many)
    listed = [line.split(" ", 1)[0] for line in text.split("\n\n", 2)[-1].splitlines() if line[:1].isdigit()]
    assert listed == ["0", "1", str(len(many) - 2), str(len(many) - 1)]
    assert "\n...\n" in text
