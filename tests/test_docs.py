"""The documentation site builds in strict mode, and the code its pages mark runnable runs.

A block is runnable when the line before its ```python fence is ``<!-- run -->``. A page's
runnable blocks run in order in one namespace (each goes on from the one before, as a reader's
session would), in a temporary working directory, with training runs cut to at most 20 steps.
"""

import doctest
import importlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import workbench

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RUNNABLE = re.compile(r"^<!-- run -->\n```python\n(.*?)^```", re.S | re.M)
# modules whose docstrings carry examples (the API reference shows them): each is run as a doctest
DOCTESTED = ["workbench.registry", "workbench.experiments.base", "workbench.params", "workbench.summary",
             "workbench.models.efficientzero", "workbench.models.ilql", "workbench.models.query",
             "workbench.ui.figures"]
PAGES = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md") if RUNNABLE.search(path.read_text()))


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config),
                           "--site-dir", str(site)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})


def test_the_site_builds_in_strict_mode(tmp_path):
    done = mkdocs_build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    # the pages are there, and the API reference was generated from the docstrings
    site = tmp_path / "site"
    assert "Watch your own model" in (site / "getting-started" / "index.html").read_text()
    assert 'id="workbench.watch"' in (site / "reference" / "watch" / "index.html").read_text()
    registry = (site / "reference" / "registry" / "index.html").read_text()
    assert 'id="workbench.create_model"' in registry and "MemoryLimitError" in registry


def test_a_new_page_is_built_and_checked_and_a_broken_link_fails_the_build(tmp_path):
    # the same configuration over a copy of the pages plus a page the nav does not name (yet), with a
    # link pointing nowhere: the page is taken in (under "More") and checked, and strict mode refuses it
    copy = tmp_path / "project"
    shutil.copytree(DOCS, copy / "docs")
    # (the API reference is built by the test above: stubs here, and so no anchors into it to check)
    config = (ROOT / "mkdocs.yml").read_text()
    assert "  anchors: warn\n" in config
    (copy / "mkdocs.yml").write_text(config.replace("  anchors: warn\n", "  anchors: info\n"))
    for page in (copy / "docs" / "reference").glob("*.md"):
        page.write_text(f"# {page.stem}\n")
    (copy / "docs" / "new-page.md").write_text("# A new page\n\nSee [the missing page](no-such-page.md).\n")
    done = mkdocs_build(copy / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "new-page.md" in done.stderr and "no-such-page.md" in done.stderr
    assert "not included in the" not in done.stderr  # the nav took the page in

    (copy / "docs" / "new-page.md").write_text("# A new page\n\nSee [getting started](getting-started.md).\n")
    done = mkdocs_build(copy / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert 'href="new-page/"' in (tmp_path / "site" / "index.html").read_text()  # in the nav of every page


def test_pages_have_runnable_blocks():
    # the marker is easy to mistype; the pages that teach the API must keep their runnable blocks
    assert {"getting-started.md", "registry.md", "experiments.md", "watch.md", "runs.md"} <= set(PAGES)


# a dotted name of the package (`workbench.ui.findings.merge_calls`), and an attribute of a watch (`w.record_next()`;
# not the "w.r.t." of "gradients w.r.t. the outputs")
PACKAGE_NAME = re.compile(r"(?<![\w/.])workbench(?:\.[A-Za-z_]\w*)+")
WATCH_ATTRIBUTE = re.compile(r"(?<![\w.])w\.(?!r\.t\.)([A-Za-z_]\w*)")


def eval_dotted(dotted: str) -> object:
    """What ``a.b.c`` names (a page's name, a ``::: a.b.c`` entry of the API reference): the longest importable
    module, then attributes; AttributeError or ImportError where it names nothing."""
    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for attribute in parts[split:]:
            found = getattr(found, attribute)
        return found
    raise ImportError(dotted)


def resolves(dotted: str) -> bool:
    """Whether ``a.b.c`` names something (:func:`eval_dotted`)."""
    try:
        eval_dotted(dotted)
    except (AttributeError, ImportError):
        return False
    return True


def test_the_names_the_pages_mention_exist():
    # prose and unmarked blocks are not run: a renamed function or method would go stale there unseen
    import torch

    pages = {path.relative_to(ROOT).as_posix(): path.read_text() for path in [ROOT / "README.md", *DOCS.rglob("*.md")]}
    missing = [f"{page}: {name}" for page, text in pages.items()
               for name in sorted(set(PACKAGE_NAME.findall(text))) if not resolves(name)]
    with workbench.watch(torch.nn.Linear(2, 2)) as w:  # (instance attributes too: w.errors, w.recorder)
        missing += [f"{page}: w.{name}" for page, text in pages.items()
                    for name in sorted(set(WATCH_ATTRIBUTE.findall(text))) if not hasattr(w, name)]
    assert len(pages) > 20 and not missing, missing


def test_the_options_watch_md_lists_are_watchs_arguments_with_their_defaults():
    import ast
    import inspect

    section = (DOCS / "watch.md").read_text().split("## Options\n", 1)[1].split("\n## ", 1)[0]
    listed: dict[str, object] = {}
    for bullet in re.findall(r"^- (.*?):", section, re.M):  # "`a`, `b` [True]" or "`a` [1], `b` [None]"
        waiting = []
        for name, default in re.findall(r"`(\w+)`(?: \[([^\]]+)\])?", bullet):
            waiting.append(name)
            if default:
                listed.update(dict.fromkeys(waiting, ast.literal_eval(default.strip("`"))))
                waiting = []
    arguments = {name: parameter.default for name, parameter in inspect.signature(workbench.watch).parameters.items()
                 if parameter.default is not inspect.Parameter.empty}
    assert listed == arguments


# a call on a page (prose or code, run or not): its name (with the dot before it, where it has one: `exp.run(`
# gives `.run`, `workbench.watch(` gives `.watch`), then its arguments, calls inside them allowed
CALL = re.compile(r"((?:\.|(?<![\w.]))\w+)\(((?:[^()]|\((?:[^()]|\([^()]*\))*\))*)\)")


def documented_callables() -> dict[str, object]:
    """The public functions and methods whose keyword arguments the pages are checked against, by the name a
    page calls them with (``.run``: a method, called on an object); a pair where the first passes its ``**``
    keywords on to the second."""
    from workbench import checkpoints
    from workbench.diagnose import diagnose
    from workbench.experiments import Experiment
    from workbench.instrument.distributed import watch_distributed
    from workbench.ui import explorer
    from workbench.ui.notebook import Compare, Dashboard, ModelBrowser

    return {"watch": workbench.watch, "watch_compiled": workbench.watch_compiled,
            "watch_distributed": watch_distributed, "Recorder": workbench.Recorder,
            "create_model": workbench.create_model, "list_models": workbench.list_models,
            "register_model": workbench.register_model, "probe": workbench.probe, "summarize": workbench.summarize,
            "load_run": workbench.load_run, "list_runs": workbench.list_runs, "compare_runs": workbench.compare_runs,
            ".export": workbench.Run.export, ".to_pandas": workbench.Run.to_pandas,
            ".subscribe": workbench.Watch.subscribe, ".patch": workbench.Watch.patch, ".ablate": workbench.Watch.ablate,
            ".save": Experiment.save,
            # (their **watch_options go to watch)
            ".run": (Experiment.run, workbench.watch), ".start": (Experiment.start, workbench.watch),
            "diagnose": diagnose,
            "load_checkpoint": checkpoints.load_checkpoint, "load_weights": checkpoints.load_weights,
            "Dashboard": Dashboard, "Compare": Compare, "ModelBrowser": ModelBrowser,
            "curves_figure": explorer.curves_figure, "curves": explorer.curves, "push_through": explorer.push_through}


def test_the_keywords_the_pages_pass_are_parameters():
    # (watch.md's Options are checked with their defaults above; this covers every call a page shows, in prose
    # and in blocks that are not run: `Dashboard(run, tab="site")`, `exp.run(300, save_every=100)`)
    import inspect

    callables = documented_callables()
    unknown = []
    for path in [ROOT / "README.md", *DOCS.rglob("*.md")]:
        for called, arguments in CALL.findall(path.read_text()):
            called = called if called in callables else called.lstrip(".")  # (a method, else a function)
            if called not in callables:
                continue
            chain = callables[called] if isinstance(callables[called], tuple) else (callables[called],)
            parameters = {}
            for function in chain:
                parameters |= inspect.signature(function).parameters
            if inspect.Parameter.VAR_KEYWORD in {p.kind for p in inspect.signature(chain[-1]).parameters.values()}:
                continue
            own = re.sub(r"\((?:[^()]|\([^()]*\))*\)", "()", arguments)  # (the keywords of calls inside are theirs)
            unknown += [f"{path.relative_to(ROOT)}: {called}(... {keyword}=...)"
                        for keyword in re.findall(r"(?:^|[,(])\s*(\w+)\s*=(?!=)", own) if keyword not in parameters]
    assert not unknown, unknown


def test_the_design_pages_layout_names_every_module():
    # (a contributor finds the code by the layout: a module added without a line there is one they do not find)
    layout = (DOCS / "design.md").read_text().split("## Layout\n", 1)[1].split("\n## ", 1)[0]
    package = ROOT / "workbench"
    modules = [path for path in [*package.glob("*"), *(package / "ui").glob("*.py")]
               if not path.name.startswith(("_", ".")) and (path.suffix == ".py" or (path / "__init__.py").exists())]
    missing = [path.relative_to(ROOT).as_posix() for path in modules
               if not re.search(rf"(?<![\w.]){re.escape(path.stem)}(?:\.py|/)?(?![\w])", layout)]
    assert len(modules) > 20 and not missing, f"design.md's layout names no {missing}"


def test_the_thresholds_diagnose_md_gives_are_the_defaults():
    # ("`persist` (3)", "`dead_zero_frac` (80%)", "`diverge_regain` (half)": each a field of Thresholds and its default)
    import dataclasses

    from workbench.diagnose import Thresholds

    defaults = {field.name: field.default for field in dataclasses.fields(Thresholds)}
    given = [(name, value) for name, value in re.findall(r"`(\w+)` \(([^)]*)\)", (DOCS / "diagnose.md").read_text())
             if name in defaults]

    def read(value: str) -> float:
        if value.startswith("half"):
            return 0.5
        return float(value[:-1]) / 100 if value.endswith("%") else float(value)

    wrong = [f"`{name}` ({value}): the default is {defaults[name]}" for name, value in given
             if read(value) != defaults[name]]
    assert len({name for name, _ in given}) > 15 and not wrong, wrong


# the pages that give command lines, and whose: the experiments' `run` (and torchrun's flags), or app.py
COMMAND_LINE_PAGES = {"experiments.md": "experiments", "distributed.md": "experiments", "app/index.md": "app",
                      "getting-started.md": "app"}
# a flag (`--per-rank`, torchrun's `--nproc_per_node`), not a dash written as two hyphens ("a run--and")
FLAG = re.compile(r"(?<![\w-])--[a-z][a-z_-]*[a-z]")


def program_flags() -> dict[str, set[str]]:
    """The flags each program's --help names: ``experiments`` (its ``run``, and torchrun's, which the same
    command lines start with) and ``app`` (app.py)."""
    import contextlib
    import io

    import app as app_script
    from torch.distributed.run import get_args_parser
    from workbench.experiments.__main__ import main as experiments_main

    helps = {}
    for program, show_help in [("experiments", lambda: experiments_main(["run", "--help"])),
                               ("app", lambda: app_script.main(["--help"]))]:
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown), pytest.raises(SystemExit):
            show_help()
        helps[program] = set(FLAG.findall(shown.getvalue()))
    helps["experiments"] |= set(FLAG.findall(get_args_parser().format_help()))
    return helps


def test_the_command_line_flags_the_pages_name_exist():
    helps = program_flags()
    unknown = [f"{page}: {flag}" for page, program in COMMAND_LINE_PAGES.items()
               for flag in sorted(set(FLAG.findall((DOCS / page).read_text())) - helps[program])]
    assert len(helps["experiments"]) > 10 and not unknown, unknown


def test_every_flag_of_the_command_lines_is_in_the_pages():
    # (the other way round from the test above: a flag added to the experiments' `run` or to app.py
    # that no page names is a capability a reader never learns of)
    import contextlib
    import io

    import app as app_script
    from workbench.experiments.__main__ import main as experiments_main

    text = "\n".join(path.read_text() for path in DOCS.rglob("*.md"))
    undocumented = []
    for program, show_help in [("python -m workbench.experiments run", lambda: experiments_main(["run", "--help"])),
                               ("app.py", lambda: app_script.main(["--help"]))]:
        shown = io.StringIO()
        with contextlib.redirect_stdout(shown), pytest.raises(SystemExit):
            show_help()
        flags = set(FLAG.findall(shown.getvalue())) - {"--help"}
        assert len(flags) > 3, shown.getvalue()
        undocumented += [f"{program} {flag}" for flag in sorted(flags)
                         if not re.search(re.escape(flag) + r"(?![\w-])", text)]
    assert not undocumented, undocumented


# modules whose public functions and classes (their __all__) the API reference (docs/reference/*.md) shows,
# each with a `::: name` entry
REFERENCED_MODULES = ["workbench", "workbench.experiments", "workbench.instrument", "workbench.ui.notebook"]


def test_every_public_function_and_class_is_in_the_api_reference():
    import inspect

    entries = set(re.findall(r"^::: (\S+)", "\n".join(p.read_text() for p in (DOCS / "reference").glob("*.md")),
                             re.M))
    shown = {id(eval_dotted(entry)) for entry in entries}
    missing = []
    for module_name in REFERENCED_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            value = getattr(module, name)
            if (inspect.isclass(value) or inspect.isfunction(value)) and id(value) not in shown:
                missing.append(f"{module_name}.{name}")
    assert not missing, f"not in the API reference (docs/reference/*.md): {missing}"


def test_the_main_classes_public_methods_and_properties_have_docstrings():
    # the API reference shows a member only where it has a docstring (mkdocs.yml: show_if_no_docstring: false):
    # a public method or property of these without one is missing from it, unseen
    import inspect

    from workbench.ui.notebook import Compare, Dashboard

    undocumented = []
    for cls in (workbench.Watch, workbench.Run, workbench.Recorder, Dashboard, Compare):
        for owner in cls.__mro__[:-1]:  # (and what they inherit, object's aside)
            for name, member in vars(owner).items():
                function = member.fget if isinstance(member, property) else inspect.unwrap(
                    member.__func__ if isinstance(member, (staticmethod, classmethod)) else member)
                if not name.startswith("_") and inspect.isfunction(function) and not function.__doc__:
                    undocumented.append(f"{owner.__qualname__}.{name}")
    assert not undocumented, f"no docstring, so not in the API reference: {undocumented}"


def test_the_checks_of_the_pages_names_take_legitimate_prose():
    # (prose a page may hold that names no watch attribute and no unknown flag: "w.r.t." was read as w.r,
    # torchrun's --standalone and --nproc_per_node (torch's own spelling) as unknown flags, "--and" of a dash too)
    assert WATCH_ATTRIBUTE.findall("gradients w.r.t. the outputs, then `w.step()` and w.recorder") == ["step",
                                                                                                       "recorder"]
    line = "torchrun --standalone --nproc_per_node=2 -m workbench.experiments run mlp --steps 5 --per-rank; a run--and"
    assert set(FLAG.findall(line)) - program_flags()["experiments"] == set()


def shortened(code: str) -> str:
    """Training runs of a block cut to at most 20 steps."""
    return re.sub(r"\.(run|start)\((\d+)", lambda m: f".{m.group(1)}({min(int(m.group(2)), 20)}", code)


@pytest.mark.parametrize("page", PAGES)
def test_runnable_blocks_of_a_page_run(page, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the pages write runs/ and exports into the working directory
    registered = set(workbench.list_models())
    experiments = set(workbench.experiments.list_experiments())
    namespace: dict = {"__name__": f"docs/{page}"}
    try:
        for number, block in enumerate(RUNNABLE.findall((DOCS / page).read_text()), 1):
            exec(compile(shortened(block), f"docs/{page}, runnable block {number}", "exec"), namespace)
    finally:  # the registries are process-wide: leave them as found
        for name in set(workbench.list_models()) - registered:
            workbench.unregister_model(name)
        for name in set(workbench.experiments.list_experiments()) - experiments:
            workbench.experiments.unregister_experiment(name)


@pytest.mark.parametrize("module", DOCTESTED)
def test_the_examples_in_the_docstrings_run(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples may record runs into runs/
    result = doctest.testmod(importlib.import_module(module), optionflags=doctest.ELLIPSIS, report=True)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} example(s) of {module} failed; the output above shows them"


# modules whose public functions and methods document every argument and what they return
COMPLETE = ["registry", "experiments/base", "summary", "ui/figures"]


def test_public_docstrings_document_every_argument_and_the_return():
    import griffe

    package = griffe.load("workbench", search_paths=[str(ROOT)], docstring_parser="google")
    gaps = []
    for path in COMPLETE:
        module = package[path.replace("/", ".")]
        public = getattr(module, "exports", None) or [n for n in module.members if not n.startswith("_")]
        for name in public:
            member = module.members.get(name)
            if member is None or member.is_alias:
                continue
            functions = [member] if member.is_function else [
                m for n, m in member.members.items() if member.is_class and m.is_function and not n.startswith("_")]
            for function in functions:
                if function.docstring is None:
                    gaps.append(f"{function.path}: no docstring")
                    continue
                sections = function.docstring.parse("google")
                documented = {p.name.lstrip("*") for s in sections if s.kind.value == "parameters" for p in s.value}
                arguments = [p.name for p in function.parameters if p.name not in ("self", "cls")]
                missing = [a for a in arguments if a not in documented]
                if missing and len(arguments) > 0:
                    gaps.append(f"{function.path}: arguments not in Args: {missing}")
                returns = str(function.returns) if function.returns is not None else "None"
                if returns != "None" and "property" not in function.labels and not any(
                        s.kind.value == "returns" for s in sections):
                    gaps.append(f"{function.path}: returns {returns} without a Returns section")
    assert not gaps, "\n".join(gaps)


@pytest.mark.parametrize("page", ["design.md", "runs.md"])
def test_the_record_schema_a_page_lists_is_the_rows_columns(page):
    from workbench.instrument import ROW_COLUMNS

    text = " ".join((DOCS / page).read_text().split())  # (a list may wrap over lines)
    schemas = [found.split(", ") for found in re.findall(r"`((?:\w+, ){5,}\w+)`", text)]
    assert schemas, f"{page} lists no record schema"
    for names in schemas:
        assert names == list(ROW_COLUMNS), f"{page} lists {names}; the rows' columns are {list(ROW_COLUMNS)}"
