"""The side-by-side job (specdec/study/peers/vs_llamacpp.py): every method on every prompt in rotating order, rates over
the generation phase, identity against each engine's own plain run, and ratios per turn summarised with intervals.

llama.cpp's binaries are not built in the tests: its runs here come from a stand-in that replays our own engine's
runs at a known speed factor through the same row builder (llamacpp_row) the real runner uses. Each of our runs is
made once and replayed (once_each), so the stand-in's rate is the very run's rate over SLOWER and the table's ratios
must come out at that factor exactly: no ratio of two wall-clock runs is asserted."""

import math
import os
from pathlib import Path

import pandas as pd
import pytest
import torch

import snakemake_runs
from specdec.gguf import quant
from specdec.gguf.loading import load_gguf_for_decoding
from specdec.load import make_draft
from specdec.runtime import Runtime
from specdec.study.peers.vs_llamacpp import (LLAMACPP, PLAIN, SPECDEC, TABLE_COLUMNS, Method, format_ratios,
                                       generation_rate, llamacpp_row, methods_for, ours_runner, side_by_side_job,
                                       summarize)
from specdec.testing import GGUF_TARGET_SCALES, tiny_gguf_with_tokenizer

pytestmark = pytest.mark.slow  # the study's side-by-side job, not exactness: the full suite, not the fast tier
REPO = Path(__file__).resolve().parents[1]
GGUF = Runtime(weights="gguf", threads=1)
MAX_NEW = 12
SLOWER = 2.0  # the stand-in llama.cpp runs at half our engine's rate


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    if not quant.available():
        pytest.skip("specdec.native._quant (the quantized product) not built")
    root = tmp_path_factory.mktemp("vs-llamacpp")
    target_file = tiny_gguf_with_tokenizer(root / "target.gguf", layers=2, norm_scale=GGUF_TARGET_SCALES)
    draft_file = tiny_gguf_with_tokenizer(root / "draft.gguf", layers=1, norm_scale=GGUF_TARGET_SCALES[:1])
    target, vocabulary = load_gguf_for_decoding(target_file, GGUF, max_length=64)
    proposers = {"model": make_draft("model", {"kind": "model", "model": "draft"}, target, vocabulary, draft_file,
                                     GGUF),
                 "lookup": make_draft("lookup", {"kind": "prompt_lookup", "ngram_max": 3}, target, vocabulary, None,
                                      GGUF)}
    return target, proposers


@pytest.fixture(scope="module")
def prompts():
    g = torch.Generator().manual_seed(3)
    return pd.DataFrame({"prompt_id": ["p0", "p1", "p2"], "chat_text": ["a", "b", "c"],
                         "input_ids": [torch.randint(3, 64, (int(n),), generator=g).tolist() for n in (7, 12, 9)]})


def stand_in_llamacpp(run_ours, calls):
    """Replays our run of the same method (plain, or the 'model' draft at the method's k) as llama.cpp's parsed
    output would carry it, SLOWER times slower; records the calls."""

    def run(method, prompt, max_new_tokens):
        calls.append((prompt.prompt_id, str(method)))
        ours = run_ours(Method(SPECDEC, PLAIN if method.plain else "model", method.k),
                        torch.tensor([prompt.input_ids]), max_new_tokens)
        parsed = {"pieces": [str(t) for t in ours["tokens"]], "n_emitted": ours["n_tokens"],
                  "tokens_per_second": ours["tokens_per_second"] / SLOWER,
                  "prompt_ids": list(prompt.input_ids) if method.plain else [],
                  "n_drafted": ours["drafted"], "n_accept": ours["accepted"],
                  "n_acc_tokens": ours["accepted"], "n_call_accept": ours["target_passes"] - 1}
        return llamacpp_row(method, parsed)

    return run


def once_each(run_ours):
    """Our runner with each (method, prompt, length) decoded once: a second call returns the first run's row, so the
    job's run of a method and the stand-in's replay of it are one run."""
    made = {}

    def run(method, input_ids, max_new_tokens):
        key = (method, tuple(input_ids[0].tolist()), max_new_tokens)
        if key not in made:
            made[key] = run_ours(method, input_ids, max_new_tokens)
        return dict(made[key])

    return run


@pytest.fixture(scope="module")
def runs(engine, prompts):
    target, proposers = engine
    ours = once_each(ours_runner(target, proposers))
    calls = []
    methods = methods_for({"model": 2, "lookup": 3}, "model", 2)
    frame = side_by_side_job(prompts, methods, run_ours=ours, run_llamacpp=stand_in_llamacpp(ours, calls),
                             max_new_tokens=MAX_NEW, log=lambda line: None)
    return frame.assign(domain="code"), methods, calls


def test_every_method_runs_on_every_prompt_in_rotating_order(runs, prompts):
    frame, methods, calls = runs
    assert len(frame) == len(prompts) * len(methods)
    for index, (prompt_id, turn) in enumerate(frame.groupby("prompt_id", sort=False)):
        ran = [Method(r.engine, r.draft, r.k) for r in turn.sort_values("order").itertuples()]
        shift = index % len(methods)
        assert ran == [*methods[shift:], *methods[:shift]], prompt_id
    # llama.cpp ran its two methods once per prompt (no warm-up for a fresh process)
    assert sorted(calls) == sorted((p, str(m)) for p in prompts["prompt_id"] for m in methods if m.engine == LLAMACPP)


def test_speculative_runs_equal_their_engines_plain_runs_and_prompt_ids_are_compared(runs):
    frame, _, _ = runs
    assert frame["identical"].all() and frame["first_diff"].isna().all()
    plain_llama = frame[(frame["engine"] == LLAMACPP) & (frame["draft"] == PLAIN)]
    assert plain_llama["same_prompt_ids"].all()
    assert frame[frame["engine"] == SPECDEC]["same_prompt_ids"].isna().all()  # ours decode the ids themselves
    spec = frame[frame["draft"] != PLAIN]
    assert (spec["drafted"] > 0).all() and (spec["tokens_per_pass"] >= 1).all()


def test_a_different_run_is_counted_with_its_first_difference(engine, prompts):
    target, proposers = engine
    ours = ours_runner(target, proposers)

    def wrong_llamacpp(method, prompt, n):  # its speculative run loses the last token
        row = stand_in_llamacpp(ours, [])(method, prompt, n)
        return row if method.plain else {**row, "tokens": row["tokens"][:-1], "n_tokens": row["n_tokens"] - 1}

    frame = side_by_side_job(prompts.head(1), methods_for({}, "model", 2), run_ours=ours,
                             run_llamacpp=wrong_llamacpp, max_new_tokens=MAX_NEW, log=lambda line: None)
    spec = frame[(frame["engine"] == LLAMACPP) & (frame["draft"] != PLAIN)].iloc[0]
    assert not spec["identical"] and spec["first_diff"] == spec["n_tokens"]


def test_the_table_gives_per_turn_ratios_with_intervals(runs):
    frame, methods, _ = runs
    table = summarize(frame, MAX_NEW)
    assert list(table.columns) == TABLE_COLUMNS and len(table) == len(methods)
    assert {"draft", "domain", "k", "n_prompts", "max_new_tokens", "plain_ratio", "plain_ratio_lo", "plain_ratio_hi",
            "spec_ratio", "spec_ratio_lo", "spec_ratio_hi"} <= set(table.columns)
    assert (table["plain_ratio_lo"] <= table["plain_ratio"]).all()
    assert (table["plain_ratio"] <= table["plain_ratio_hi"]).all()
    rows = table.set_index(["engine", "draft"])
    llama_plain = rows.loc[(LLAMACPP, PLAIN)]
    assert llama_plain["spec_ratio"] == pytest.approx(1.0) and llama_plain["speedup"] == pytest.approx(1.0)
    by_turn = frame.set_index(["prompt_id", "repeat", "engine", "draft"])["tokens_per_second"]
    expected = [by_turn[(p, 0, SPECDEC, "lookup")] / by_turn[(p, 0, LLAMACPP, PLAIN)]
                for p in frame["prompt_id"].unique()]
    assert rows.loc[(SPECDEC, "lookup"), "spec_ratio"] == pytest.approx(float(pd.Series(expected).median()))
    # the stand-in replayed our very runs SLOWER times slower: every turn's ratio is SLOWER, and so are its bounds
    ours_plain = rows.loc[(SPECDEC, PLAIN)]
    assert [ours_plain["plain_ratio_lo"], ours_plain["plain_ratio"], ours_plain["plain_ratio_hi"]] == \
        pytest.approx([SLOWER] * 3)
    # llama.cpp's speculative run replayed our 'model' draft's run at the same k, both plains likewise: one speedup
    ours_model = rows.loc[(SPECDEC, "model")]
    assert rows.loc[(LLAMACPP, "model"), "speedup"] == pytest.approx(ours_model["speedup"])
    assert (table["n_identical"] == table["n_compared"]).all() and (table["n_prompts"] == 3).all()
    assert rows.loc[(LLAMACPP, PLAIN), "n_same_prompt_ids"] == 3
    printed = format_ratios(table)
    assert printed.count("\n") == len(table) and "lookup" in printed


def test_our_rate_leaves_the_prefill_pass_out(engine, prompts):
    target, proposers = engine
    from specdec.decode import generate_speculative

    result = generate_speculative(target, proposers["model"], torch.tensor([prompts.iloc[0]["input_ids"]]), 2, MAX_NEW)
    rate, seconds = generation_rate(result)
    first = result.steps[0]
    assert seconds == pytest.approx(result.total_seconds - first.verify_seconds - first.draft_seconds
                                    - first.decide_seconds)
    assert 0 < seconds < result.total_seconds and rate == pytest.approx((len(result.tokens) - 1) / seconds)


def test_a_llamacpp_row_takes_its_counters():
    parsed = {"pieces": ["a", "b", "c", "d"], "n_emitted": 4, "tokens_per_second": 10.0, "n_drafted": 6,
              "n_accept": 3, "n_acc_tokens": 3, "n_call_accept": 2, "process_seconds": 1.5}
    row = llamacpp_row(Method(LLAMACPP, "d", 3), parsed)
    assert row["acceptance"] == 0.5 and row["tokens_per_pass"] == 2.5 and row["tokens"] == ["a", "b", "c", "d"]
    plain = llamacpp_row(Method(LLAMACPP), {**parsed, "prompt_ids": [1, 2]})
    assert math.isnan(plain["acceptance"]) and plain["tokens_per_pass"] == 1.0 and plain["prompt_ids"] == [1, 2]


# --- settings and the workflow's plan --------------------------------------------------------------------------------
def test_settings_fill_defaults_and_match_the_schema():
    import yaml

    from specdec.study.peers.llamacpp import SIDE_BY_SIDE_DEFAULTS, side_by_side_settings

    s = side_by_side_settings({"vs_llamacpp": {"drafts": {"lookup": "3"}, "llamacpp": {"k": 4}}})
    assert s["drafts"] == {"lookup": 3} and s["llamacpp"] == {"draft": "qwen2.5-coder-0.5b-instruct", "k": 4}
    assert s["max_new_tokens"] == 128 and side_by_side_settings({}) == {**SIDE_BY_SIDE_DEFAULTS, "drafts": {}}
    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    section = schema["properties"]["vs_llamacpp"]["properties"]
    assert {key: section[key].get("default") for key in ("drafts", "max_new_tokens", "prompts_per_domain",
                                                         "repeats")} == {
        key: SIDE_BY_SIDE_DEFAULTS[key] for key in ("drafts", "max_new_tokens", "prompts_per_domain", "repeats")}
    assert {key: v["default"] for key, v in section["llamacpp"]["properties"].items()} == SIDE_BY_SIDE_DEFAULTS[
        "llamacpp"]


def test_a_later_layer_drops_a_draft_and_llamacpps_speculative_run_with_null():
    """Config layers merge dictionaries, so a null is how a layer removes what an earlier one named
    (experiments/cpu-lead/three-drafts.yaml): the draft leaves the methods, and llama.cpp runs plain only."""
    from specdec.study.peers.llamacpp import side_by_side_settings

    s = side_by_side_settings({"vs_llamacpp": {"drafts": {"lookup": 2, "model": None}, "llamacpp": {"draft": None}}})
    assert s["drafts"] == {"lookup": 2} and s["llamacpp"]["draft"] is None
    methods = methods_for(s["drafts"], s["llamacpp"]["draft"], s["llamacpp"]["k"])
    assert [str(m) for m in methods] == ["specdec plain", "specdec lookup k2", "llama.cpp plain"]


def test_the_three_draft_layer_plans_jobs_without_the_dropped_drafts_or_llamacpps_draft():
    import yaml
    from snakemake.utils import update_config

    from specdec.study.peers.llamacpp import side_by_side_settings

    _planned("--configfile", "config/gguf.yaml", "experiments/cpu-lead/config.yaml",
             "experiments/cpu-lead/three-drafts.yaml", "--",
             "results/experiments/cpu-lead/a-test-machine/vs_llamacpp/runs/code.parquet",
             env={"SPECDEC_MACHINE": "a-test-machine"})
    config = {}
    for layer in ("config.yaml", "config/gguf.yaml", "experiments/cpu-lead/config.yaml",
                  "experiments/cpu-lead/three-drafts.yaml"):  # stacked as Snakemake stacks --configfile layers
        update_config(config, yaml.safe_load((REPO / layer).read_text()))
    settings = side_by_side_settings(config)
    assert settings["drafts"] == {"lookup": 2, "coder-0.5b-v64k": 2, "coder-0.5b-long-lookup": 6}
    assert settings["llamacpp"]["draft"] is None


def _dry_run(*args, env=None):
    return snakemake_runs.run(["--dry-run", "--forceall", "--nolock", "--cores", "2", *args], cwd=REPO,
                              env=None if env is None else {**os.environ, **env})


def _planned(*args, env=None) -> str:
    """The dry run's output, which must have succeeded."""
    result = _dry_run(*args, env=env)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def test_the_workflow_plans_one_job_per_domain_on_the_gguf_files_and_refuses_the_fp32_regime():
    output = _planned("--configfile", "config/gguf.yaml", "--", "vs_llamacpp")
    jobs = [block.split("\n\n")[0] for block in output.split("rule vs_llamacpp_run:")[1:]]
    assert len(jobs) == 4  # one per domain of config.yaml
    for job in jobs:
        assert "resources/gguf/qwen2.5-coder-1.5b-instruct.gguf" in job  # the target's file, for both engines
        assert "resources/gguf/qwen2.5-coder-0.5b-instruct.gguf" in job and "resources/llamacpp/" in job
        assert "resources/models/" not in job
    assert "results/study-gguf/tables/vs_llamacpp.csv" in output
    fp32 = _dry_run("--", "vs_llamacpp")
    assert fp32.returncode != 0 and "runtime.weights 'gguf'" in fp32.stdout + fp32.stderr


def test_a_feature_head_in_the_side_by_side_job_gets_its_trained_heads_directory():
    """A draft whose model is of its own kind (the Q8_0 head behind lookup, experiments/feature-head-vs-llamacpp)
    runs from the directory of the head it drafts with, not from a GGUF file: the job's inputs name it (without it
    the job stopped at its first draft with 'needs its model directory'). The layer's results_dir names {machine}:
    its runs land in the machine's own directory."""
    output = _planned("--configfile", "config/gguf.yaml", "config/heads.yaml",
                      "experiments/feature-head-vs-llamacpp/config.yaml", "--",
                      "results/experiments/feature-head-vs-llamacpp/a-test-machine/vs_llamacpp/runs/code.parquet",
                      env={"SPECDEC_MACHINE": "a-test-machine"})
    job = output.split("rule vs_llamacpp_run:")[1].split("\n\n")[0]
    assert "resources/models/coder-head" in job and "resources/gguf/qwen2.5-coder-1.5b-instruct.gguf" in job
