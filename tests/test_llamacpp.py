"""The llamacpp stage: parsing llama.cpp's counters and timings (fixtures recorded from real runs of the binaries the
stage builds, see tests/fixtures/llamacpp/README.md), the build's one-line error when a tool is missing, the GGUF
export of a truncated draft, and that only the `llamacpp` target schedules the stage."""

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from specdec.study.peers import llamacpp as lc

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "llamacpp"
REPO = Path(__file__).resolve().parents[1]


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def fixture_facts() -> dict:
    return json.loads(fixture("facts.json"))


# --------------------------------------------------------------------------------------------------- parsing
def test_parse_plain_run_recorded_from_llama_completion():
    facts = fixture_facts()["plain"]
    run = lc.parse_plain(fixture("plain.jsonl"))
    assert run["n_emitted"] == facts["n_emitted"]
    assert "".join(run["pieces"]) == facts["text"]
    assert run["n_prompt_llama"] == facts["n_prompt_tokens"]
    # llama.cpp read the prompt file as the prompt table's chat_text: the same token ids as input_ids (this needs the
    # extra newline write_prompt adds, since -f drops one)
    assert run["prompt_ids"] == fixture_facts()["prompt_input_ids"]
    assert run["n_eval"] == facts["n_eval"] == run["n_emitted"] - 1  # the first token comes from the prompt pass
    assert run["eval_ms"] == pytest.approx(facts["eval_ms"])
    assert run["sampling_ms"] == pytest.approx(facts["sampling_ms"])
    # tokens/s: one step plus one greedy pick per token
    per_token = facts["eval_ms"] / facts["n_eval"] + facts["sampling_ms"] / facts["n_emitted"]
    assert run["tokens_per_second"] == pytest.approx(1e3 / per_token)
    assert not run["eos"]
    # the generated tokens, not the prompt (--no-display-prompt) and not the closing lines
    assert not any("<|im_start|>" in p for p in run["pieces"])


def test_parse_speculative_run_recorded_from_llama_speculative_simple():
    facts = fixture_facts()["speculative"]
    run = lc.parse_speculative(fixture("speculative.jsonl"))
    assert run["n_prompt_llama"] == facts["n_prompt_tokens"]
    assert run["n_predict"] == facts["n_predict"]
    assert run["n_drafted"] == facts["n_drafted"]
    assert run["n_accept"] == facts["n_accept"]
    assert run["n_draft"] == facts["k"]
    assert run["n_call_accept"] == facts["n_call_accept"]
    assert run["decode_seconds"] == pytest.approx(facts["decode_seconds"])
    assert run["tokens_per_second"] == pytest.approx(facts["n_predict"] / facts["decode_seconds"])
    # the counters agree with each other: llama.cpp's mean acceptance length is 1 + accepted / passes, and the
    # draft tokens the stats line counts are speculative-simple's n_drafted / n_accept
    assert run["n_acc_tokens"] == run["n_accept"]
    assert run["n_gen_tokens"] == run["n_drafted"]
    assert run["mean_acc_len"] == pytest.approx(1 + run["n_acc_tokens"] / run["n_call_accept"], abs=0.005)
    assert len(run["acc_rate_per_pos"]) <= facts["k"]
    # every emitted token is one piece (no EOS in this run)
    assert run["n_emitted"] == run["n_predict"]
    assert "".join(run["pieces"]) == facts["text"]


def test_recorded_speculative_and_plain_outputs_compared_token_by_token():
    facts = fixture_facts()
    plain = lc.parse_plain(fixture("plain.jsonl"))
    spec = lc.parse_speculative(fixture("speculative.jsonl"))
    n = facts["max_new_tokens"]
    assert lc.first_difference(spec["pieces"], plain["pieces"], n) == facts["first_diff"]


def test_first_difference():
    assert lc.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert lc.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert lc.first_difference([1, 2, 3, 4], [1, 2, 3, 9], n=3) is None  # past n does not count
    assert lc.first_difference([1, 2], [1, 2, 3]) == 2  # a shorter output differs where it ends


def test_parse_bench_recorded_from_llama_bench():
    facts = fixture_facts()["bench"]
    frame = lc.parse_bench(fixture("bench.jsonl"))
    assert sorted(frame.loc[frame["n_gen"] == 0, "n_prompt"]) == list(range(1, facts["max_positions"] + 1))
    tg = frame[frame["n_gen"] > 0]
    assert len(tg) == 1 and int(tg["n_gen"].iloc[0]) == facts["gen_tokens"]
    assert (frame["n_depth"] == facts["depth"]).all()
    assert (frame["n_threads"] == facts["threads"]).all()
    assert frame["samples_s"].map(len).eq(facts["repetitions"]).all()
    assert frame["build_commit"].iloc[0] == facts["build_commit"]
    costs = lc.step_costs(frame.assign(model="m"))
    step = costs[costs["m"] == 0]["seconds"].iloc[0]
    assert step == pytest.approx(np.median(np.asarray(tg["samples_s"].iloc[0]) / facts["gen_tokens"]))
    pp1 = costs[costs["m"] == 1]
    assert pp1["ratio_to_step"].iloc[0] == pytest.approx(pp1["seconds"].iloc[0] / step)
    assert (costs["seconds"] > 0).all()


def test_truncated_output_is_refused():
    text = fixture("speculative.jsonl")
    cut = "\n".join(line for line in text.splitlines() if "statistics" not in line)
    with pytest.raises(lc.LlamaCppParseError, match="statistics"):
        lc.parse_speculative(cut)
    plain = "\n".join(line for line in fixture("plain.jsonl").splitlines() if "sampling time" not in line)
    with pytest.raises(lc.LlamaCppParseError, match="sampling"):
        lc.parse_plain(plain)
    with pytest.raises(lc.LlamaCppParseError):
        lc.parse_bench("no json here\n")


# --------------------------------------------------------------------------------------------------- tables
def _runs():
    rows = []
    for prompt, (plain_tps, spec_tps, diff) in {"p0": (10.0, 15.0, None), "p1": (10.0, 5.0, 3)}.items():
        rows.append({"draft": "d", "domain": "code", "prompt_id": prompt, "repeat": 0, "method": "plain", "k": 0,
                     "tokens_per_second": plain_tps, "identical": True, "first_diff": None})
        rows.append({"draft": "d", "domain": "code", "prompt_id": prompt, "repeat": 0, "method": "speculative",
                     "k": 4, "tokens_per_second": spec_tps, "identical": diff is None, "first_diff": diff,
                     "n_accept": 6, "n_drafted": 8, "n_acc_tokens": 6, "n_call_accept": 2})
    return pd.DataFrame(rows)


def _costs():
    rows = [{"model": "t", "m": 0, "seconds": 0.10}, {"model": "d", "m": 0, "seconds": 0.04}]
    rows += [{"model": "t", "m": m, "seconds": 0.10 + 0.01 * (m - 1)} for m in range(1, 10)]
    rows += [{"model": "d", "m": m, "seconds": 0.04 + 0.005 * (m - 1)} for m in range(1, 10)]
    return pd.DataFrame(rows)


def test_summary_counts_divergences_and_uses_the_cost_model():
    facts = {"t": {"n_layers": 28, "step_bytes": 1000}, "d": {"n_layers": 24, "step_bytes": 400}}
    table = lc.summarize(_runs(), _costs(), facts, "t", threads=2)
    row = table.iloc[0]
    assert (row["n_identical"], row["n_compared"]) == (1, 2)
    assert row["first_diffs"] == "p1@3"
    assert row["acceptance"] == pytest.approx(12 / 16)
    assert row["tokens_per_pass"] == pytest.approx(1 + 12 / 4)
    assert row["speedup"] == pytest.approx(np.median([1.5, 0.5]))
    assert row["c"] == pytest.approx(0.4)
    assert row["depth_ratio"] == pytest.approx(24 / 28)
    assert row["bytes_ratio"] == pytest.approx(0.4)
    assert row["verify_ratio_k1"] == pytest.approx(0.14 / 0.10)
    # k draft steps + the draft's pass over k+1 positions + the target's verify pass over k+1 positions
    expected = 4.0 * 0.10 / (4 * 0.04 + 0.14 + (0.04 + 0.06) - 0.04)
    assert row["predicted_speedup"] == pytest.approx(expected)
    assert np.isnan(row["engine_baseline_tokens_per_s"])  # no study runs given: NaN, not made up


def test_engine_speeds_from_study_runs(tmp_path):
    def runs(draft, k, rows):
        path = tmp_path / f"runs/greedy/{draft}/code/k{k}/seed0/sequences.parquet"
        path.parent.mkdir(parents=True)
        pd.DataFrame(rows, columns=["prompt_id", "method", "n_tokens", "total_seconds"]).to_parquet(path)
        return path

    files = [runs("d", 4, [("p0", "baseline", 32, 4.0), ("p0", "speculative", 32, 2.0), ("p9", "baseline", 32, 1.0)]),
             runs("hybrid", 4, [("p0", "baseline", 32, 2.0), ("p0", "speculative", 32, 1.0)])]
    engine = lc.engine_speeds(files, {"code": {"p0"}})  # p9 is not one of llama.cpp's prompts
    assert len(engine) == 4 and set(engine["prompt_id"]) == {"p0"}
    same = lc.engine_scale(engine, "d", "code", 4, fallback=["hybrid"])
    assert same == {"engine_baseline_tokens_per_s": 12.0, "engine_spec_tokens_per_s": 16.0, "engine_draft": "d"}
    other = lc.engine_scale(engine, "distilled", "code", 4, fallback=["hybrid"])  # no runs of that draft: the study's
    assert other["engine_draft"] == "hybrid" and other["engine_spec_tokens_per_s"] == 32.0
    assert np.isnan(lc.engine_scale(engine, "d", "code", 8)["engine_spec_tokens_per_s"])  # no k = 8 runs: NaN
    assert lc.engine_speeds([tmp_path / "missing/x/y/z/w.parquet"]).empty


# --------------------------------------------------------------------------------------------------- build errors
def test_build_names_a_missing_cmake_and_the_build_log(tmp_path):
    log = tmp_path / "logs/cmake.log"
    with pytest.raises(lc.LlamaCppBuildError) as err:
        lc.build_llamacpp(tmp_path / "missing.tar.gz", tmp_path / "out", version="0.3.36", sha256="0" * 64,
                          build_log=log, cmake=str(tmp_path / "no/such/cmake"))
    message = str(err.value)
    assert "\n" not in message
    assert "cmake" in message and str(tmp_path / "no/such/cmake") in message and "not an executable file" in message
    assert str(log) in message
    assert "C compiler" not in message  # cc and c++ are there
    assert not (tmp_path / "out").exists()


def test_build_on_a_path_without_tools_names_every_missing_one(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    with pytest.raises(lc.LlamaCppBuildError) as err:
        lc.build_llamacpp(tmp_path / "x.tar.gz", tmp_path / "out", version="0.3.36", sha256="0" * 64,
                          build_log="logs/llamacpp/0.3.36/cmake.log", path=str(empty))
    message = str(err.value)
    for missing in ("cmake 'cmake'", "C compiler 'cc'", "C++ compiler 'c++'"):
        assert missing in message
    assert "not found on PATH" in message and "logs/llamacpp/0.3.36/cmake.log" in message


def test_build_refuses_a_source_archive_with_the_wrong_checksum(tmp_path):
    if not all(shutil.which(t) for t in ("cmake", "cc", "c++")):
        pytest.skip("no build tools on this machine")
    sdist = tmp_path / "llama_cpp_python-0.3.36.tar.gz"
    sdist.write_bytes(b"not the pinned archive")
    with pytest.raises(lc.LlamaCppBuildError, match="sha256"):
        lc.build_llamacpp(sdist, tmp_path / "out", version="0.3.36", sha256="0" * 64, build_log=tmp_path / "b.log")


# --------------------------------------------------------------------------------------------------- commands
def test_command_lines_pin_greedy_k_and_threads():
    s = lc.RunSettings(threads=3, max_new_tokens=32)
    plain = lc.plain_command("bin", "t.gguf", "p.txt", s)
    spec = lc.speculative_command("bin", "t.gguf", "d.gguf", "p.txt", 4, s)
    for cmd in (plain, spec):
        assert cmd[cmd.index("--temp") + 1] == "0" and cmd[cmd.index("-t") + 1] == "3"
        assert cmd[cmd.index("-n") + 1] == "32" and "--log-jsonl" in cmd and "--no-escape" in cmd
    assert Path(plain[0]).name == "llama-completion" and "-no-cnv" in plain
    assert Path(spec[0]).name == "llama-speculative-simple"
    assert spec[spec.index("--spec-draft-n-max") + 1] == "4" and spec[spec.index("--spec-type") + 1] == "draft-simple"
    assert spec[spec.index("--spec-draft-p-min") + 1] == "0" and spec[spec.index("-td") + 1] == "3"
    bench = lc.bench_command("bin", "t.gguf", threads=2, depth=256, max_positions=9, gen_tokens=32, repetitions=5)
    assert bench[bench.index("-p") + 1] == "1,2,3,4,5,6,7,8,9" and bench[bench.index("-d") + 1] == "256"


def test_repack_off_reaches_every_tool_and_a_crash_names_the_setting(tmp_path):
    on, off = lc.RunSettings(threads=2, max_new_tokens=8), lc.RunSettings(threads=2, max_new_tokens=8, repack=False)
    for make in (lambda s: lc.plain_command("bin", "t.gguf", "p.txt", s),
                 lambda s: lc.speculative_command("bin", "t.gguf", "d.gguf", "p.txt", 4, s)):
        assert "--no-repack" not in make(on) and "--no-repack" in make(off)
    bench = dict(threads=2, depth=256, max_positions=9, gen_tokens=32, repetitions=5)
    assert "--repack" not in lc.bench_command("bin", "t.gguf", **bench)
    off_bench = lc.bench_command("bin", "t.gguf", repack=False, **bench)
    assert off_bench[off_bench.index("--repack") + 1] == "0"
    assert lc.settings({})["repack"] is True
    # A tool that dies of a segmentation fault, as llama.cpp's AMX repack does on passes over several positions.
    crash = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"]
    with pytest.raises(lc.LlamaCppRunError, match="llamacpp.repack: false"):
        lc.run_tool(crash)
    with pytest.raises(lc.LlamaCppRunError) as already_off:
        lc.run_tool([*crash, "--no-repack"])
    assert "repack" not in str(already_off.value).split(":")[0]
    with pytest.raises(lc.LlamaCppRunError) as other:
        lc.run_tool([sys.executable, "-c", "raise SystemExit(3)"])
    assert "exited 3:" in str(other.value) and "repack" not in str(other.value)


def test_settings_fill_defaults():
    s = lc.settings({"llamacpp": {"version": "9.9", "bench": {"depth": 64}}})
    assert s["version"] == "9.9" and s["bench"]["depth"] == 64 and s["bench"]["repetitions"] == 5
    assert lc.settings({})["sha256"] == lc.DEFAULTS["sha256"]
    assert lc.sdist_name("llama-cpp-python", "0.3.36") == "llama_cpp_python-0.3.36.tar.gz"


# --------------------------------------------------------------------------------------------------- GGUF
QWEN2_TINY = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
              "vocab_size": 64}


def _tiny_base_gguf(path: Path, n_layers: int = 2) -> dict:
    """A 2-layer Qwen2-shaped GGUF (random weights, Q8_0 matrices, F32 norms and biases); its tensors by HF name."""
    import gguf

    h, f, v, kv = 32, 64, 64, 16
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(n_layers):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                   p + "self_attn.q_proj.weight": (h, h), p + "self_attn.q_proj.bias": (h,),
                   p + "self_attn.k_proj.weight": (kv, h), p + "self_attn.k_proj.bias": (kv,),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.v_proj.bias": (kv,),
                   p + "self_attn.o_proj.weight": (h, h), p + "mlp.gate_proj.weight": (f, h),
                   p + "mlp.up_proj.weight": (f, h), p + "mlp.down_proj.weight": (h, f)}
    rng = np.random.default_rng(0)
    state = {k: rng.normal(0, 0.5, s).astype(np.float32) for k, s in shapes.items()}
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN2, n_layers)
    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_block_count(n_layers)
    writer.add_name("tiny")
    writer.add_token_list([f"t{i}" for i in range(v)])
    for key, array in state.items():
        name = names.get_name(key, try_suffixes=(".weight", ".bias"))
        if array.ndim == 2:
            q = gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0)
            writer.add_tensor(name, q, raw_shape=list(q.shape), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return state, names


def test_export_of_a_truncated_draft_is_an_exact_cut_of_the_base_gguf(tmp_path):
    import gguf
    import torch
    from safetensors.torch import save_file

    state, names = _tiny_base_gguf(tmp_path / "base.gguf")
    base = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "base.gguf")).tensors}
    cut = {}
    for key, value in state.items():  # what derive_truncated saves: the first layer of the dequantised model
        if ".layers.1." in key:
            continue
        t = base[names.get_name(key, try_suffixes=(".weight", ".bias"))]
        cut[key] = torch.from_numpy(gguf.quants.dequantize(t.data, t.tensor_type).reshape(value.shape).copy())
    changed = "model.layers.0.mlp.up_proj.weight"
    cut[changed] = cut[changed] + 0.01  # as distillation would
    draft = tmp_path / "draft"
    draft.mkdir()
    save_file(cut, str(draft / "model.safetensors"))
    (draft / "config.json").write_text(json.dumps({**QWEN2_TINY, "model_type": "qwen2", "num_hidden_layers": 1}))

    how = lc.export_gguf(draft, tmp_path / "base.gguf", tmp_path / "draft.gguf", log=lambda m: None)

    out = gguf.GGUFReader(str(tmp_path / "draft.gguf"))
    assert out.fields["qwen2.block_count"].contents() == 1
    assert out.fields["tokenizer.ggml.tokens"].contents() == [f"t{i}" for i in range(64)]
    tensors = {t.name: t for t in out.tensors}
    assert set(tensors) == {n for n in base if not n.startswith("blk.1.")}
    assert how["blk.0.ffn_up.weight"] == "quantised Q8_0"
    for name, t in tensors.items():
        if name == "blk.0.ffn_up.weight":
            values = gguf.quants.dequantize(t.data, t.tensor_type).reshape(cut[changed].shape)
            assert np.abs(values - cut[changed].numpy()).max() < 0.02
            assert not np.array_equal(np.asarray(t.data), np.asarray(base[name].data))
        else:
            assert how[name].startswith("copied")
            assert t.tensor_type == base[name].tensor_type
            assert np.array_equal(np.asarray(t.data), np.asarray(base[name].data))
    facts = lc.gguf_facts(tmp_path / "draft.gguf")
    assert facts["n_layers"] == 1 and not facts["tied_head"]
    assert facts["step_bytes"] < facts["tensor_bytes"]  # the embedding is looked up, not read whole


# --------------------------------------------------------------------------------------------------- workflow
def _gguf_study(root: Path) -> Path:
    """A tiny study whose target and draft are pypi-gguf models (never fetched: dry runs only)."""
    import yaml

    from specdec.testing import build_tiny_study

    config = build_tiny_study(root)
    parts = {"package_prefix": "no-such-part", "count": 1, "version": "0.1"}
    for name in ("gguf-target", "gguf-draft"):
        config["models"][name] = {"source": "pypi-gguf", "parts": parts, "gguf_sha256": "0" * 64}
    config["target"] = "gguf-target"  # the study keeps its drafts; llama.cpp gets the GGUF one
    config["llamacpp"] = {"drafts": ["gguf-draft"], "k": [1, 3]}
    path = root / "config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


@pytest.mark.slow  # two Snakemake dry runs, ~10 s
def test_only_the_llamacpp_target_schedules_the_stage(tmp_path):
    from test_workflow import job_counts, snakemake

    configfile = _gguf_study(tmp_path)
    default = snakemake(tmp_path, "--dry-run", "--cores", "1", configfile=configfile)
    assert default.returncode == 0, default.stderr[-3000:]
    counts = job_counts(default.stdout)
    assert counts.get("decode", 0) > 0
    assert not [rule for rule in counts if rule.startswith("llamacpp")]

    stage = snakemake(tmp_path, "--dry-run", "--cores", "1", "llamacpp", configfile=configfile)
    assert stage.returncode == 0, stage.stdout[-3000:] + stage.stderr[-3000:]
    counts = job_counts(stage.stdout)
    assert counts["llamacpp_fetch_source"] == 1 and counts["llamacpp_build"] == 1
    assert counts["llamacpp_gguf"] == 2  # target and draft
    assert counts["llamacpp_decode"] == 2  # one job per (draft, domain), every k inside
    assert counts["llamacpp_bench"] == 1 and counts["llamacpp_table"] == 1 and counts["llamacpp"] == 1
    assert not {"decode", "verify_greedy", "study_table", "provenance"} & set(counts)


@pytest.mark.slow
def test_build_rule_stops_with_one_line_when_cmake_is_missing(tmp_path):
    """The whole path through Snakemake: the build job fails, says what is missing and where the log is, and no
    other stage is touched."""
    import yaml
    from test_workflow import snakemake

    configfile = _gguf_study(tmp_path)
    config = yaml.safe_load(configfile.read_text())
    sdist = tmp_path / "resources/downloads/llama-cpp-python/llama_cpp_python-0.3.36.tar.gz"
    sdist.parent.mkdir(parents=True)
    sdist.write_bytes(b"stand-in for the sdist")
    config["llamacpp"]["cmake"] = "/nonexistent/cmake"
    configfile.write_text(yaml.safe_dump(config, sort_keys=False))
    result = snakemake(tmp_path, "--cores", "1", "resources/llamacpp/0.3.36", configfile=configfile)
    assert result.returncode != 0
    lines = [line for line in (result.stderr + result.stdout).splitlines()
             if line.startswith("specdec: llamacpp_build")]
    assert len(lines) == 1, result.stderr[-3000:]
    assert "'/nonexistent/cmake' (llamacpp.cmake) not an executable file" in lines[0]
    assert "logs/llamacpp/0.3.36/cmake.log" in lines[0]
    assert not (tmp_path / "resources/llamacpp/0.3.36").exists()
    assert not (tmp_path / "results").exists()  # nothing else ran


def test_prompt_file_survives_the_newline_llama_cpp_drops(tmp_path):
    text = "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    path = lc.write_prompt(text, tmp_path / "p.txt")
    content = path.read_text()
    assert content.endswith("\n") and content[:-1] == text  # -f pops exactly one trailing newline
