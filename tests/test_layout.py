"""The shape the project promises: the engine reads on its own, and a draft kind is declared in one place."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ENGINE = ["specdec.decode", "specdec.sampling", "specdec.lm", "specdec.drafts", "specdec.fp32.kernels",
          "specdec.fp32.loading", "specdec.gguf.loading", "specdec.load", "specdec.cli"]


def _specdec_imports(module: str) -> set[str]:
    """The specdec modules `module` imports anywhere in its source, inside functions too (the front door and the
    CLI import the engines on first use, which importing them alone would not show)."""
    path = REPO / (module.replace(".", "/") + ".py")
    if not path.is_file():
        path = REPO / module.replace(".", "/") / "__init__.py"
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            parts = parts[:len(parts) - node.level + 1] if node.level else []  # a relative import's package
            found.add(".".join([*parts, *([node.module] if node.module else [])]))
    return {name for name in found if name.split(".")[0] == "specdec"}


def _study_or_pandas_after_importing(*modules: str) -> tuple[int, str]:
    """Import `modules` in a fresh interpreter; the pandas and specdec.study modules that this pulls in."""
    code = (f"import sys, {', '.join(modules)}; bad = sorted(m for m in sys.modules if m.split('.')[0] == 'pandas' "
            "or m.startswith('specdec.study')); print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    return result.returncode, result.stdout.strip() + result.stderr[-500:]


def test_the_engine_imports_neither_pandas_nor_the_study():
    # One interpreter for all of them and what they import on first use (imports only add modules: if the lot pulls
    # in nothing, none does); when something is pulled in, one interpreter per module names the culprits.
    modules = sorted(set(ENGINE).union(*map(_specdec_imports, ENGINE)))
    assert "specdec.fp32.loading" in _specdec_imports("specdec.load")  # the lazy imports are seen
    returncode, _ = _study_or_pandas_after_importing(*modules)
    if returncode != 0:
        culprits = {m: out for m in modules for rc, out in [_study_or_pandas_after_importing(m)] if rc != 0}
        pytest.fail(f"engine modules pull in pandas or the study: {culprits}")


def test_no_draft_kind_is_dispatched_on_its_name_outside_the_registry():
    # A draft's kind is only ever looked up (get_kind). A line that tests something called kind against a draft kind's
    # name is a dispatch the registry should answer. (The step records' `kind` column, prefill / block / target,
    # is another thing.)
    from specdec.drafts import kind_names

    names = "|".join(kind_names())
    pattern = re.compile(rf"""kind.*(==|!=|\bin\b).*["']({names})["']|["']({names})["'].*(==|!=|\bin\b).*kind""")
    offenders = []
    files = [*REPO.glob("specdec/**/*.py"), *REPO.glob("workflow/**/*.py"), *REPO.glob("workflow/**/*.smk"),
             REPO / "Snakefile"]
    for path in files:
        if path.name == "registry.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if pattern.search(line):
                offenders.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert offenders == []


# What the workflow's table and plot stages import: no torch, no transformers (each import costs a job several
# seconds; a study runs dozens of these jobs). One interpreter for all: imports only add modules.
TABLE_STAGE_MODULES = ["specdec.fp32.kernel_tables", "specdec.native.build", "specdec.drafts", "specdec.study.io",
                       "specdec.study.report.analysis", "specdec.study.cost.model", "specdec.study.cost.prediction",
                       "specdec.study.machine", "specdec.study.cost.verdict",
                       "specdec.study.verify.distribution_verdict"]


def test_the_table_stages_import_neither_torch_nor_transformers():
    code = (f"import sys, {', '.join(TABLE_STAGE_MODULES)}; print(sorted({{m.split('.')[0] for m in sys.modules}} & "
            "{'torch', 'transformers'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stdout + result.stderr[-500:]
