"""experiments/INDEX.md, generated: every experiment with its question, the CPU types it ran on and where its results
are, and where each committed file of the earlier results layout went.

    python -m specdec.study.experiments_index            # rewrite experiments/INDEX.md
    python -m specdec.study.experiments_index --check    # exit 1, naming the problems, if it is stale or incomplete

An experiment is a directory experiments/<name>/ with
- config.yaml: its layer over config.yaml; `results_dir: results/experiments/<name>/{machine}` (the machine id, as
  results/machines/ names machines, stands for {machine}), so a run on another CPU type writes beside the others;
- README.md: `# <name>`, then the sections Question, Command, Machine and Answer; the Machine section names each
  machine it ran on as a bullet "- `<machine id>` (<CPU type>): ...".
experiments/moved.tsv lists the earlier paths (results/<old>/..., config/<old>.yaml) and where each went.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

SECTIONS = ("Question", "Command", "Machine", "Answer")
INDEX = "experiments/INDEX.md"
MOVED = "experiments/moved.tsv"
RESULTS = "results/experiments"
MACHINE_LINE = re.compile(r"^- `([^`]+)` \(([^)]+)\)")


@dataclass
class Experiment:
    name: str
    question: str
    machines: dict[str, str]  # machine id -> CPU type, as the README names them
    results: str  # the experiment's results directory (results_dir without its /{machine})
    sections: dict[str, str] = field(default_factory=dict)


def readme_sections(text: str) -> tuple[str, dict[str, str]]:
    """(the title, {section heading: its text}) of a README of `# title` and `## Section` headings."""
    title, sections, current = "", {}, None
    for line in text.splitlines():
        if line.startswith("# ") and not title:
            title = line[2:].strip()
        elif line.startswith("## "):
            current = line[3:].strip()
            sections[current] = ""
        elif current is not None:
            sections[current] += line + "\n"
    return title, {k: v.strip() for k, v in sections.items()}


def first_sentence(text: str) -> str:
    paragraph = " ".join(text.split("\n\n")[0].split())
    match = re.match(r"(.+?[.?!])(\s|$)", paragraph)
    return match.group(1) if match else paragraph


def results_root(results_dir: str | None) -> str | None:
    """The directory an experiment's runs write under: results_dir up to its {machine}."""
    if not results_dir:
        return None
    return results_dir.split("/{machine}")[0].rstrip("/")


def read_experiment(directory: Path) -> Experiment:
    title, sections = readme_sections((directory / "README.md").read_text()) if (directory / "README.md").exists() \
        else ("", {})
    config = yaml.safe_load((directory / "config.yaml").read_text()) if (directory / "config.yaml").exists() else {}
    machines = {}
    for line in sections.get("Machine", "").splitlines():
        match = MACHINE_LINE.match(line.strip())
        if match:
            machines[match.group(1)] = match.group(2)
    return Experiment(name=directory.name, question=first_sentence(sections.get("Question", "")),
                      machines=machines, results=results_root((config or {}).get("results_dir")) or "",
                      sections=sections | {"_title": title})


def experiments(root: Path) -> list[Experiment]:
    return [read_experiment(d) for d in sorted((root / "experiments").iterdir()) if d.is_dir()]


def moved_paths(root: Path) -> list[tuple[str, str]]:
    """(old path, new path) of every file the reorganisation moved, as experiments/moved.tsv records them."""
    path = root / MOVED
    if not path.exists():
        return []
    rows = [line.split("\t") for line in path.read_text().splitlines() if line and not line.startswith("#")]
    return [(old, new) for old, new in rows]


def moved_directories(moves: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The moves summed up by directory: each earlier top directory (results/<name>/) is one row, old/ -> new/, by
    the prefix substitution most of its files followed, then a row for each of its files that went elsewhere (a file
    row overrides its directory's); a top-level file is a row of its own."""
    groups: dict[str, list[tuple[str, str]]] = {}
    for old, new in moves:
        parts = old.split("/")
        key = "/".join(parts[:2]) + "/" if len(parts) > 2 else old
        groups.setdefault(key, []).append((old, new))
    rows = []
    for key, pairs in groups.items():
        if not key.endswith("/"):
            rows.extend(pairs)
            continue
        targets = [new[: len(new) - len(old) + len(key)] if new.endswith(old[len(key):]) else None
                   for old, new in pairs]
        counts = {target: targets.count(target) for target in targets if target}
        common = max(counts, key=lambda target: (counts[target], target)) if counts else None
        if common is None:
            rows.extend(pairs)
            continue
        rows.append((key, common))
        rows.extend(pair for pair, target in zip(pairs, targets) if target != common)
    return rows


def machine_dirs(root: Path, experiment: Experiment) -> list[str]:
    """The machine directories under an experiment's results directory (names results/machines/ knows, or that
    its README's Machine section names)."""
    base = root / experiment.results
    if not experiment.results or not base.is_dir():
        return []
    known = {p.name for p in (root / "results/machines").iterdir()} if (root / "results/machines").is_dir() else set()
    return sorted(d.name for d in base.iterdir() if d.is_dir() and (d.name in known or d.name in experiment.machines))


def render(root: Path) -> str:
    lines = ["# Experiments", "",
             "Generated by `python -m specdec.study.experiments_index` from each experiment's README.md and",
             "config.yaml (do not edit: `tests/test_experiments_index.py` fails when this file is stale). The study is",
             "config.yaml (results/study/) and its layers in config/ (config/README.md: the gguf regime in",
             "results/study-gguf/); profiles and fits per machine are in results/machines/<machine id>/. An experiment",
             "is a layer over them with a home of its own: experiments/<name>/ (config.yaml, README.md: question,",
             "command, machine, answer) and results/experiments/<name>/<machine id>/ per CPU type it ran on.", "",
             "| experiment | question | machines | results |", "|---|---|---|---|"]
    for exp in experiments(root):
        dirs = machine_dirs(root, exp)
        machines = "; ".join(f"{exp.machines.get(d, d)}" for d in dirs) or "; ".join(exp.machines.values())
        results = f"[{exp.results}/](../{exp.results}/)" if exp.results else ""
        question = exp.question.replace("|", "\\|")
        lines.append(f"| [{exp.name}]({exp.name}/README.md) | {question} | {machines} | {results} |")
    moves = moved_paths(root)
    if moves:
        lines += ["", "## Where the earlier paths went", "",
                  f"Every committed table, plot and layer of the earlier layout, from `{MOVED}` (one file a line).",
                  "By directory (a file's own row overrides its directory's):", "", "| earlier path | now |",
                  "|---|---|"]
        lines += [f"| `{old}` | `{new}` |" for old, new in moved_directories(moves)]
        lines += ["", "<details><summary>Every file</summary>", "", "| earlier path | now |", "|---|---|"]
        lines += [f"| `{old}` | `{new}` |" for old, new in moves]
        lines += ["", "</details>"]
    return "\n".join(lines) + "\n"


def problems(root: Path) -> list[str]:
    """What keeps the index from being complete and current: a results directory no experiment owns, an experiment
    without its layer, README sections, results or machines, a moved file not where the map says, a stale INDEX.md."""
    found = []
    exps = experiments(root)
    owned = {exp.results for exp in exps}
    results = root / RESULTS
    for d in sorted(results.iterdir()) if results.is_dir() else []:
        if d.is_dir() and f"{RESULTS}/{d.name}" not in owned:
            found.append(f"{RESULTS}/{d.name}/ belongs to no experiment (experiments/{d.name}/ with its config.yaml)")
    for exp in exps:
        where = f"experiments/{exp.name}"
        if not (root / where / "config.yaml").exists():
            found.append(f"{where}/ has no config.yaml (its layer)")
        missing = [s for s in SECTIONS if s not in exp.sections]
        if missing or exp.sections.get("_title") != exp.name:
            found.append(f"{where}/README.md needs the title '# {exp.name}' and the sections {list(SECTIONS)}; "
                         f"missing: {missing}")
        if exp.results and exp.results != f"{RESULTS}/{exp.name}":
            found.append(f"{where}/config.yaml's results_dir is not under {RESULTS}/{exp.name}/")
        if exp.results and not (root / exp.results).is_dir():
            found.append(f"{where} lists {exp.results}/, which does not exist")
        for d in machine_dirs(root, exp):
            if d not in exp.machines:
                found.append(f"{exp.results}/{d}/ is not named in {where}/README.md's Machine section")
        if not exp.machines:
            found.append(f"{where}/README.md's Machine section names no machine ('- `<machine id>` (<CPU type>): ...')")
    for old, new in moved_paths(root):
        if not (root / new).exists():
            found.append(f"{old} moved to {new}, which does not exist")
    index = root / INDEX
    if not index.exists() or index.read_text() != render(root):
        found.append(f"{INDEX} is stale: run python -m specdec.study.experiments_index")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("."), help="the checkout (default: here)")
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if the index is not current")
    args = parser.parse_args(argv)
    if not args.check:
        (args.root / INDEX).write_text(render(args.root))
    found = problems(args.root)
    for problem in found:
        print(problem, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
