"""The README's headline table is made from the committed tables (specdec.study.report.headline), so it cannot drift."""

from pathlib import Path

import pandas as pd
import pytest
import yaml

from specdec.study.report import headline as H

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_carries_the_table_the_committed_results_give():
    assert H.readme_copy((ROOT / "README.md").read_text()) == H.headline(ROOT / "results")


def _side_by_side(root: Path, name: str, machine: str, repeats: int, plain: float, spec: dict):
    run = root / name
    (run / "vs_llamacpp").mkdir(parents=True)
    (run / "vs_llamacpp" / "provenance.yaml").write_text(yaml.safe_dump({"machine": {"id": machine}}))
    rows = [{"engine": "llamacpp", "draft": "plain", "domain": "code", "k": 0, "n_repeats": repeats,
             "plain_ratio": 1.0, "spec_ratio": 1.0}]
    for domain in H.DOMAINS:
        rows.append({"engine": "specdec", "draft": "plain", "domain": domain, "k": 0, "n_repeats": repeats,
                     "plain_ratio": plain, "spec_ratio": plain})
        for (draft, k), ratio in spec.items():
            rows.append({"engine": "specdec", "draft": draft, "domain": domain, "k": k, "n_repeats": repeats,
                         "plain_ratio": plain, "spec_ratio": ratio + (0.3 if domain == "code" else 0.0)})
    (run / "tables").mkdir()
    pd.DataFrame(rows).to_csv(run / "tables" / "vs_llamacpp.csv", index=False)


def test_rows_per_cpu_type_prefer_the_runs_with_more_repeats(tmp_path):
    zen4 = "amd-epyc-f25m17-avx2-avx512-avx512bf16-t2-torch2.13.0"
    _side_by_side(tmp_path, "one", zen4, 1, 0.95, {("lookup", 2): 2.0})  # a lucky one-repeat run: left out
    _side_by_side(tmp_path, "three", zen4, 3, 0.9, {("lookup", 2): 1.1, ("qwen2.5-coder-0.5b-instruct", 4): 1.2})
    _side_by_side(tmp_path, "xeon", "intel-xeon-f6m167-avx2-avx512-avx512bf16-amx-t2-torch2.13.0", 1, 1.5,
                  {("lookup", 2): 1.6})
    rows = H.llamacpp_rows(H.side_by_side_runs(tmp_path))
    assert rows == [{"cpu": "AMD EPYC Zen 4", "plain": "0.90", "code": "1.50 (0.5B, k 4)", "others": "1.20"},
                    {"cpu": "Intel Xeon (AMX)", "plain": "1.50", "code": "1.90 (lookup, k 2)", "others": "1.60"}]


def test_a_stale_readme_copy_is_refused(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{H.BEGIN}\n| an old table |\n{H.END}\n")
    assert H.main(["--results", str(ROOT / "results"), "--check", str(readme)]) == 1
    assert "differs from the committed tables" in capsys.readouterr().err


@pytest.mark.parametrize("values, text", [([1.0, 1.004], "1.00"), ([0.88, 0.9], "0.88–0.90")])
def test_spans(values, text):
    assert H._span(values) == text
