"""experiments/INDEX.md lists every experiment and is current: a results directory no experiment owns, an experiment
whose results, layer, README sections or machines are missing, a moved file not where the map says, or a stale index
fails here (and the same checks, on a small tree made here, show they catch each case)."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from specdec.study import experiments_index as index

REPO = Path(__file__).resolve().parents[1]


def test_the_checkout_has_no_problem():
    assert index.problems(REPO) == []


def test_index_is_current():
    assert (REPO / index.INDEX).read_text() == index.render(REPO), "run python -m specdec.study.experiments_index"


def test_every_results_directory_is_listed_and_every_listed_one_exists():
    listed = {exp.name for exp in index.experiments(REPO)}
    text = (REPO / index.INDEX).read_text()
    results = {d.name for d in (REPO / index.RESULTS).iterdir() if d.is_dir()}
    assert results <= listed and all(f"[{name}]({name}/README.md)" in text for name in listed)
    for exp in index.experiments(REPO):
        assert exp.results == f"{index.RESULTS}/{exp.name}" and (REPO / exp.results).is_dir(), exp.name
        assert index.machine_dirs(REPO, exp), f"{exp.name}: no machine's results"


def test_each_machine_directory_holds_that_machines_runs():
    """A machine directory's provenance records were made on that machine (the moves put each run under its own)."""
    checked = 0
    for exp in index.experiments(REPO):
        for machine in index.machine_dirs(REPO, exp):
            assert machine in {p.name for p in (REPO / "results/machines").iterdir()}, machine
            for record in (REPO / exp.results / machine).rglob("*provenance.yaml"):
                recorded = (yaml.safe_load(record.read_text()).get("machine") or {}).get("id")
                assert recorded in (None, machine), (record, recorded)
                checked += recorded == machine
    assert checked >= 15


def test_every_moved_file_is_tracked_where_the_map_says():
    moves = index.moved_paths(REPO)
    assert len(moves) > 200
    tracked = set(subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True).stdout.split())
    if not tracked:
        pytest.skip("not a git checkout")
    assert [new for _, new in moves if new not in tracked] == []
    assert [old for old, _ in moves if old in tracked] == []  # nothing left behind
    results = {p for p in tracked if p.startswith("results/") and not p.startswith("results/machines/")}
    mapped = {new for _, new in moves if new.startswith("results/")}
    # every committed result is mapped, or is a later experiment's own (results/experiments/<name>/ with its README)
    later = {p for p in results - mapped if p.startswith("results/experiments/")
             and (REPO / "experiments" / p.split("/")[2] / "README.md").is_file()}
    assert mapped <= results and results - mapped == later


def test_the_results_top_level_is_the_study_trees_machines_and_experiments():
    top = {p.name for p in (REPO / "results").iterdir() if p.is_dir()} - {"quick"}
    assert top <= {"study", "study-gguf", "machines", "experiments"}, top


def _tree(tmp_path: Path) -> Path:
    """A checkout with one experiment, its results on one machine, and its index."""
    root = tmp_path / "repo"
    (root / "experiments/one").mkdir(parents=True)
    (root / "results/machines/m1").mkdir(parents=True)
    (root / "results/experiments/one/m1/tables").mkdir(parents=True)
    (root / "experiments/one/config.yaml").write_text("results_dir: results/experiments/one/{machine}\n")
    (root / "experiments/one/README.md").write_text(
        "# one\n\n## Question\n\nDoes it? More.\n\n## Command\n\n    snakemake\n\n## Machine\n\n"
        "- `m1` (CPU One): today\n\n## Answer\n\nYes.\n")
    (root / "experiments/moved.tsv").write_text(
        "# old\tnew\nresults/old/a.csv\tresults/experiments/one/m1/tables/a.csv\n")
    (root / "results/experiments/one/m1/tables/a.csv").write_text("x\n")
    assert index.main(["--root", str(root)]) == 0
    return root


def test_the_index_of_a_small_tree(tmp_path):
    root = _tree(tmp_path)
    text = (root / index.INDEX).read_text()
    assert "| [one](one/README.md) | Does it? | CPU One | [results/experiments/one/]" in text
    assert "| `results/old/` | `results/experiments/one/m1/tables/` |" in text
    assert index.problems(root) == []


@pytest.mark.parametrize("break_it, complaint", [
    (lambda r: (r / "results/experiments/two/m1").mkdir(parents=True), "results/experiments/two/ belongs to no"),
    (lambda r: shutil.rmtree(r / "results/experiments/one"), "lists results/experiments/one/, which does not exist"),
    (lambda r: (r / "results/experiments/one/m2").mkdir(), "results/experiments/one/m2/ is not named"),
    (lambda r: (r / "experiments/one/config.yaml").unlink(), "experiments/one/ has no config.yaml"),
    (lambda r: (r / "experiments/one/README.md").write_text("# one\n\n## Question\n\nDoes it?\n"),
     "missing: ['Command', 'Machine', 'Answer']"),
    (lambda r: (r / "results/experiments/one/m1/tables/a.csv").unlink(), "which does not exist"),
    (lambda r: (r / index.INDEX).write_text("stale\n"), "experiments/INDEX.md is stale"),
])
def test_the_checks_catch_each_gap(tmp_path, break_it, complaint):
    root = _tree(tmp_path)
    (root / "results/machines/m2").mkdir()
    break_it(root)
    found = index.problems(root)
    assert any(complaint in problem for problem in found), found
    assert index.main(["--root", str(root), "--check"]) == 1


def test_the_index_module_does_not_import_pandas():
    import ast

    tree = ast.parse(Path(index.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                for alias in getattr(node, "names", [])} | {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert "pandas" not in imported


def test_config_readme_lists_every_layer_of_the_study_and_documents_every_key():
    """config/README.md's Layers table names each file of config/ and no other; every top-level key of the schema
    is documented there."""
    import re

    text = (REPO / "config/README.md").read_text()
    layers = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"^\| `([\w.-]+\.yaml)`", layers, flags=re.M))
    assert listed == {p.name for p in (REPO / "config").glob("*.yaml")}
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    assert [key for key in schema["properties"] if f"`{key}" not in text] == []
