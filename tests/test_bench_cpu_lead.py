"""bench/prompt_pass.py, bench/heldout_cli.py and bench/argmax_head.py (experiments/cpu-lead) on tiny GGUF files, and
bench/multiply_rate.py's probe: they run, write the rows they claim, and refuse what they cannot run (their timings
belong to the experiment, not to a test)."""

import contextlib
import os
import platform
import runpy
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from specdec import testing
from specdec.gguf import quant

BENCH = Path(__file__).resolve().parents[1] / "bench"
needs_product = pytest.mark.skipif(not quant.available(), reason="specdec.native._quant not built")


@pytest.fixture(scope="module")
def prompt_pass():
    return runpy.run_path(str(BENCH / "prompt_pass.py"))


@pytest.fixture(scope="module")
def heldout():
    return runpy.run_path(str(BENCH / "heldout_cli.py"))


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("cpu-lead")
    scales = testing.GGUF_TARGET_SCALES
    return {"target": testing.tiny_gguf_with_tokenizer(root / "target.gguf", layers=2, norm_scale=scales),
            "draft": testing.tiny_gguf_with_tokenizer(root / "draft.gguf", layers=1, norm_scale=scales[:1])}


@needs_product
def test_the_prompt_pass_is_timed_per_kernel_and_written_per_round(prompt_pass, files, tmp_path):
    out = tmp_path / "pp.csv"
    prompt_pass["main"](["--gguf", str(files["target"]), "--n", "40", "--rounds", "2", "--threads", "1",
                         "--out", str(out)])
    frame = pd.read_csv(out)
    assert set(frame.engine) == {f"specdec:{kernel}" for kernel in quant.kernels()}
    assert len(frame) == 2 * len(quant.kernels()) and (frame.n_prompt == 40).all()
    assert (frame.tokens_per_s - 40 / frame.seconds).abs().max() < 1e-9 and (frame.seconds > 0).all()


@needs_product
def test_the_prompt_pass_times_the_plans_own_kernel_unforced(prompt_pass, files, tmp_path, monkeypatch):
    """`--kernels plan` runs the pass with no kernel named, as a user's prompt runs (the session's plan decides)."""
    forced = []
    monkeypatch.setattr(quant, "use_kernel", lambda name: forced.append(name) or contextlib.nullcontext())
    out = tmp_path / "pp.csv"
    prompt_pass["main"](["--gguf", str(files["target"]), "--n", "40", "--rounds", "1", "--threads", "1",
                         "--kernels", "plan", quant.kernels()[0], "--out", str(out)])
    assert set(pd.read_csv(out).engine) == {"specdec:plan", f"specdec:{quant.kernels()[0]}"}
    assert set(forced) == {quant.kernels()[0]}  # the plan's runs named none


def test_the_prompt_pass_refuses_a_kernel_the_cpu_does_not_run(prompt_pass, files, capsys):
    with pytest.raises(SystemExit):
        prompt_pass["main"](["--gguf", str(files["target"]), "--kernels", "avx1024"])
    assert "kernels ['avx1024'] are not product kernels this CPU runs" in capsys.readouterr().err


def test_llama_bench_is_asked_for_one_prompt_pass(prompt_pass):
    cmd = prompt_pass["llama_bench_command"](Path("bin"), "t.gguf", 512, 2, repack=False)
    assert cmd[:1] == ["bin/llama-bench"] and cmd[cmd.index("-p") + 1] == "512" and cmd[cmd.index("-n") + 1] == "0"
    assert cmd[-2:] == ["--repack", "0"]
    assert "--repack" not in prompt_pass["llama_bench_command"](Path("bin"), "t.gguf", 512, 2, repack=True)


def test_the_heldout_drafts_are_the_command_lines_options(heldout, tmp_path):
    args = heldout["draft_arguments"]
    assert args("model:2", "d.gguf") == ["--draft", "d.gguf", "--k", "2"]
    assert args("model-v4096:3", "d.gguf") == ["--draft", "d.gguf", "--draft-option", "vocab=4096", "--k", "3"]
    assert args("lookup:2", "d.gguf") == ["--draft-kind", "prompt_lookup", "--k", "2"]
    assert args("hybrid:1", "d.gguf") == ["--draft-kind", "hybrid", "--draft", "d.gguf", "--k", "1"]
    for bad in ("model", "model:0", "tree:2", "model-vx:2"):
        with pytest.raises(ValueError, match=f"draft '{bad}'"):
            args(bad, "d.gguf")
    spec = tmp_path / "hybrid.yaml"
    spec.write_text("{kind: hybrid, model_k: 2, ngram_min: 3}\n")
    assert args(f"{spec}:6", "d.gguf") == ["--draft-spec", str(spec), "--draft", "d.gguf", "--k", "6"]
    spec.write_text("{kind: truncated, layers: 12}\n")  # a model of its own kind, from the draft file
    assert args(f"{spec}:2", "d.gguf") == ["--draft-spec", str(spec), "--draft", "d.gguf", "--k", "2"]
    spec.write_text("{kind: prompt_lookup, ngram_min: 3}\n")  # no model of its own: no draft file
    assert args(f"{spec}:6", "d.gguf") == ["--draft-spec", str(spec), "--k", "6"]
    spec.write_text("[1, 2]\n")
    with pytest.raises(ValueError, match="not a YAML mapping"):
        args(f"{spec}:6", "d.gguf")


@needs_product
def test_the_heldout_check_runs_the_command_line_and_records_identity(heldout, files, tmp_path):
    prompts = tmp_path / "prompts.yaml"
    prompts.write_text(yaml.safe_dump([{"category": "greeting", "prompt": "hello world"}]))
    out = tmp_path / "heldout.csv"
    heldout["main"](["--prompts", str(prompts), "--target", str(files["target"]), "--draft-file",
                     str(files["draft"]), "--drafts", "model:2", "model-v40:2", "--max-new-tokens", "6",
                     "--threads", "1", "--out", str(out)])
    frame = pd.read_csv(out)
    assert list(frame.draft) == ["model:2", "model-v40:2"] and frame.greedy_identical.all()
    assert (frame.new_tokens == 6).all() and (frame.prompt_tokens > 2).all() and (frame.speedup > 0).all()


@pytest.fixture(scope="module")
def multiply_rate():
    return runpy.run_path(str(BENCH / "multiply_rate.py"))


@pytest.mark.skipif(shutil.which("gcc") is None or platform.machine() != "x86_64",
                    reason="the probe is x86 assembly built with gcc")
def test_the_multiply_rate_probe_runs_what_this_cpu_has_on_every_core(multiply_rate, tmp_path):
    have = multiply_rate["runnable"](multiply_rate["cpu_flags"]())
    assert "ymm-vpmaddubsw" in have  # every CPU the study runs has AVX2
    out = tmp_path / "rate.csv"
    multiply_rate["main"](["--instructions", "ymm-vpmaddubsw", "ymm-vpmaddwd", "--rounds", "20000", "--cores", "2",
                           "--out", str(out)])
    frame = pd.read_csv(out)
    cores = min(2, len(os.sched_getaffinity(0)))
    assert list(frame.instruction) == ["ymm-vpmaddubsw"] * cores + ["ymm-vpmaddwd"] * cores
    assert (frame.per_s > 0).all()
    macs = frame.instruction.map({name: spec[0] for name, spec in multiply_rate["INSTRUCTIONS"].items()})
    assert ((frame.macs_per_s - frame.per_s * macs).abs() <= 1e-9 * frame.macs_per_s).all()


def test_the_multiply_rate_probe_refuses_an_instruction_the_cpu_lacks(multiply_rate, capsys, monkeypatch):
    monkeypatch.setitem(multiply_rate["main"].__globals__, "cpu_flags", lambda: {"avx2"})
    with pytest.raises(SystemExit):
        multiply_rate["main"](["--instructions", "zmm-vpdpbusd"])
    assert "['zmm-vpdpbusd'] are not instructions this CPU runs" in capsys.readouterr().err


def test_the_multiply_rate_probe_refuses_rounds_its_loop_cannot_count(multiply_rate, capsys):
    with pytest.raises(SystemExit):
        multiply_rate["main"](["--rounds", "0"])
    assert "--rounds and --cores must be at least 1" in capsys.readouterr().err


def test_the_probe_keeps_twelve_independent_accumulators_per_instruction(multiply_rate):
    source = multiply_rate["probe_source"](["zmm-vpdpbusd"])
    targets = {line.rsplit("%%", 1)[1].split("\\n")[0] for line in source.splitlines() if "vpdpbusd %%" in line}
    assert targets == {f"zmm{i}" for i in range(12)}


@pytest.fixture(scope="module")
def group_rate():
    return runpy.run_path(str(BENCH / "group_rate.py"))


needs_x86_gcc = pytest.mark.skipif(shutil.which("gcc") is None or platform.machine() != "x86_64",
                                   reason="the group functions are x86 code; the probe is built with gcc")


@pytest.fixture(scope="module")
def group_rate_probe(group_rate, tmp_path_factory):
    """The probe unoptimised (4 s to build, not 20): these tests check what it runs and refuses, not its rates."""
    return group_rate["build_probe"](tmp_path_factory.mktemp("group-rate"), ["-O0", "-fopenmp"])


@needs_x86_gcc
@needs_product
def test_the_group_rate_probe_times_each_type_and_input_count_and_the_avx2_step_ceiling(group_rate, group_rate_probe,
                                                                                       tmp_path, monkeypatch):
    monkeypatch.setitem(group_rate["main"].__globals__, "build_probe", lambda where: group_rate_probe)
    out = tmp_path / "rate.csv"
    group_rate["main"](["--types", "q4_k", "q8_0", "--kernels", "avx2", "--modes", "l2", "--inputs", "1", "5",
                        "--rounds", "2", "--work", "0.01", "--out", str(out)])
    frame = pd.read_csv(out)
    cells = list(zip(frame.type, frame["mode"], frame.inputs))
    # Q8_0 takes at most 4 inputs a pass: its 5 is not a cell; the step ceiling is Q4_K's on avx2
    assert cells == [("q4_k", "l2", 1), ("q4_k", "l2", 5), ("q8_0", "l2", 1),
                     ("q4_k", "step-ceiling", 1), ("q4_k", "step-ceiling", 5)]
    assert (frame.kernel == "avx2").all() and (frame.rounds == 2).all()
    assert ((frame.gmacs_min > 0) & (frame.gmacs_min <= frame.gmacs_median)
            & (frame.gmacs_median <= frame.gmacs_max)).all()


def test_the_group_rate_probe_refuses_a_kernel_the_cpu_does_not_run_and_inputs_past_a_pass(group_rate, capsys,
                                                                                          monkeypatch):
    monkeypatch.setattr(quant, "kernels", lambda: ("avx2",))
    with pytest.raises(SystemExit):
        group_rate["main"](["--kernels", "avx512-vnni"])
    assert "['avx512-vnni']: not group kernels this CPU runs (it runs ['avx2'])" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        group_rate["main"](["--inputs", "9"])
    assert "--inputs from 1 to 8" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        group_rate["main"](["--work", "0"])
    assert "--work above 0" in capsys.readouterr().err


@needs_x86_gcc
def test_the_group_rate_probe_itself_refuses_what_its_group_functions_cannot_take(group_rate, group_rate_probe):
    binary = group_rate_probe
    for args, reps in ((["q5_0", "avx2", "l2", "5"], None), (["q9_k", "avx2", "l2", "1"], None),
                       (["q4_k", "avx2", "l3", "1"], None), (["q4_k", "avx2", "l2", "1"], 0),
                       (["step-ceiling", "9"], None)):
        with pytest.raises(RuntimeError, match="the probe failed"):
            group_rate["run_cell"](binary, args, 1, reps)


@pytest.fixture(scope="module")
def lean_step():
    return runpy.run_path(str(BENCH / "lean_step.py"))


def test_each_round_is_set_against_its_own_floor(lean_step):
    """A pass twice as long in a round when the host read twice as fast is the same ratio to its floor; the pairing
    is by round, so a missing reading is refused, not shifted."""
    ratios = lean_step["floor_ratios"]([0.020, 0.040], 10**9, [50e9, 25e9])
    assert ratios == pytest.approx([1.0, 1.0])
    assert lean_step["floor_ratios"]([0.030], 10**9, [40e9]) == pytest.approx([1.2])
    with pytest.raises(ValueError, match="one a round"):
        lean_step["floor_ratios"]([0.02, 0.04], 10**9, [50e9])


@needs_product
def test_the_step_bench_reads_the_bandwidth_every_round(lean_step, files, capsys, monkeypatch):
    readings = []

    def bandwidth(bytes_, repeats):  # the real torch sum, counted
        readings.append(bytes_)
        return real(64 * 2**20, repeats=1)

    real = lean_step["main"].__globals__["memory_bandwidth"]
    monkeypatch.setitem(lean_step["main"].__globals__, "memory_bandwidth", bandwidth)
    lean_step["main"](["--gguf", str(files["target"]), "--m", "1", "2", "--repeats", "3", "--context", "8",
                       "--threads", "1", "--kernels", quant.kernel_name()])
    out = capsys.readouterr().out
    assert len(readings) == 3  # one a timed round, none for the warm-up
    assert "over the rounds" in out
    rows = [line for line in out.splitlines() if " m  1:" in line or " m  2:" in line]
    assert rows and all("floor [" in line and "T(m)/T(1)" in line for line in rows)


def test_the_step_bench_refuses_no_timed_rounds(lean_step, capsys):
    with pytest.raises(SystemExit):
        lean_step["main"](["--repeats", "0"])
    assert "--repeats must be at least 1" in capsys.readouterr().err


@pytest.fixture(scope="module")
def draft_cost():
    return runpy.run_path(str(BENCH / "draft_cost.py"))


def test_the_draft_cost_is_the_median_of_each_rounds_ratio(draft_cost):
    """c pairs the draft's and the target's steps round by round: a round where both took twice as long is the same
    ratio; the median is over the ratios, not a ratio of medians."""
    rounds = [{"target": 0.030, "draft": 0.012}, {"target": 0.060, "draft": 0.024}, {"target": 0.030, "draft": 0.015}]
    table = draft_cost["cost_table"](rounds)
    assert list(table["draft"]) == ["draft"] and table["rounds"].item() == 3
    assert table["c"].item() == pytest.approx(0.4) and table["c_p90"].item() == pytest.approx(0.48)
    with pytest.raises(ValueError, match="no timed rounds"):
        draft_cost["cost_table"]([])


@needs_product
def test_the_draft_cost_bench_times_every_session_in_one_process(draft_cost, files, tmp_path, capsys):
    out = tmp_path / "c.csv"
    draft_cost["main"](["--target", str(files["target"]), "--draft", str(files["draft"]), "--head-vocab", "64",
                        "--rounds", "2", "--steps", "2", "--context", "8", "--threads", "1", "--out", str(out)])
    table = pd.read_csv(out)
    assert list(table["draft"]) == ["draft", "draft-v64"] and (table["rounds"] == 2).all()
    assert ((table["c"] > 0) & (table["c_p10"] <= table["c"]) & (table["c"] <= table["c_p90"])).all()
    assert "kernel plan" in capsys.readouterr().out


@needs_product
def test_the_draft_cost_bench_times_several_drafts_and_their_head_variants_in_the_same_rounds(draft_cost, files,
                                                                                               tmp_path, capsys):
    """Several --draft files (named by their file names), each with every --head-vocab and --head-type variant; a
    draft file of another's name, of the target's session name or of another draft's variant is refused before anything
    is timed."""
    out, other = tmp_path / "c.csv", tmp_path / "other.gguf"
    other.write_bytes(files["target"].read_bytes())  # a file of the target's types: a Q6_K head requantised
    draft_cost["main"](["--target", str(files["target"]), "--draft", str(files["draft"]), str(other),
                        "--head-vocab", "64", "--head-type", "q5_0", "--rounds", "2", "--steps", "1", "--context", "8",
                        "--threads", "1", "--out", str(out)])
    table = pd.read_csv(out)
    assert list(table["draft"]) == [f"{name}{variant}" for name in ("draft", "other")
                                    for variant in ("", "-q5_0", "-v64", "-v64-q5_0")]
    assert (table["rounds"] == 2).all() and (table["c"] > 0).all()
    copy = tmp_path / "copy" / files["draft"].name
    copy.parent.mkdir()
    copy.write_bytes(files["draft"].read_bytes())
    variant_named = tmp_path / "draft-v64.gguf"  # the name of draft.gguf's variant under --head-vocab 64
    variant_named.write_bytes(files["draft"].read_bytes())
    for clash in ([str(files["draft"]), str(copy)], [str(files["draft"]), str(files["target"])],
                  [str(variant_named), str(files["draft"]), "--head-vocab", "64"]):
        capsys.readouterr()
        with pytest.raises(SystemExit):
            draft_cost["main"](["--target", str(files["target"]), "--draft", *clash])
        assert "is taken (the target's or another draft's)" in capsys.readouterr().err


def test_the_draft_cost_bench_refuses_no_rounds(draft_cost, capsys):
    with pytest.raises(SystemExit):
        draft_cost["main"](["--rounds", "0"])
    assert "--rounds and --steps must be at least 1" in capsys.readouterr().err


@needs_product
@pytest.mark.parametrize("mode, per_prompt", [("runs", 2), ("steps", None)])
def test_the_argmax_head_bench_pairs_both_heads_on_the_same_prompts(files, tmp_path, capsys, mode, per_prompt):
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    for domain, seed in (("code", 1), ("prose", 2)):
        ids = [[int(t) for t in row] for row in np.random.default_rng(seed).integers(3, 60, (2, 9))]
        pd.DataFrame({"prompt_id": [f"{domain}-{i}" for i in range(2)], "input_ids": ids}).to_parquet(
            prompts / f"{domain}.parquet")
    out = tmp_path / "ah.csv"
    runpy.run_path(str(BENCH / "argmax_head.py"))["main"](
        ["--prompts-dir", str(prompts), "--target", str(files["target"]), "--domains", "code", "prose",
         "--prompts", "2", "--max-new-tokens", "6", "--repeats", "2", "--threads", "1", "--mode", mode,
         "--out", str(out)])
    frame = pd.read_csv(out)
    assert set(frame.domain) == {"code", "prose"} and (frame.ratio > 0).all()
    if mode == "runs":  # each prompt and repeat once, the same tokens on both heads
        assert len(frame) == 2 * 2 * per_prompt and frame.identical.all()
    else:  # one row a fed token after the first (at most 5: an end-of-sequence token may come first), both timed
        assert 0 < len(frame) <= 2 * 2 * 5 and (frame.full_head > 0).all() and (frame.argmax_head > 0).all()
        for _, steps in frame.groupby("prompt_id"):
            assert steps.step.tolist() == list(range(len(steps)))
    printed = capsys.readouterr().out
    assert "all: argmax / full head" in printed and "candidate rows a step" in printed


@pytest.mark.skipif(shutil.which("gcc") is None or platform.machine() != "x86_64",
                    reason="the probe is x86 assembly built with gcc")
def test_the_multiply_rate_probe_measures_companions_beside_a_multiply(multiply_rate, tmp_path):
    flags = multiply_rate["cpu_flags"]()
    if not {"avx512f", "avx512bw"} <= flags:
        pytest.skip("the companions are 512-bit instructions")
    out = tmp_path / "rate.csv"
    multiply_rate["main"](["--instructions", "ymm-vpmaddubsw", "--beside", "vpandd", "vpmulld", "--rounds", "20000",
                           "--cores", "1", "--out", str(out)])
    frame = pd.read_csv(out, keep_default_na=False)
    assert list(frame.beside) == ["", "vpandd", "vpmulld"] and (frame.instruction == "ymm-vpmaddubsw").all()
    shares = pd.to_numeric(frame.companion_share[frame.beside != ""])
    assert shares.notna().all() and (shares > -1).all()  # a rate, not a timing to assert on


@pytest.mark.skipif(shutil.which("gcc") is None or platform.machine() != "x86_64",
                    reason="builds an x86 probe with gcc")
def test_the_multiply_rate_probe_measures_256_bit_companions_on_the_multiplys_own_register(multiply_rate, tmp_path):
    out = tmp_path / "rate.csv"
    multiply_rate["main"](["--instructions", "ymm-vpmaddubsw", "--beside", "ymm-vpaddw", "ymm-vpmaddwd",
                           "--rounds", "20000", "--cores", "1", "--out", str(out)])
    frame = pd.read_csv(out, keep_default_na=False)
    assert list(frame.beside) == ["", "ymm-vpaddw", "ymm-vpmaddwd"] and (frame.per_s > 0).all()
    source = multiply_rate["probe_source"](["ymm-vpmaddubsw"], ["ymm-vpaddw"])
    # each companion writes the register its multiply just wrote: no chain from one round to the next, and no
    # register AVX2 lacks (ymm16 and up)
    paired = [line for line in source.splitlines() if "vpaddw %%" in line]
    assert [line.rsplit("%%", 1)[1].split("\\n")[0] for line in paired] == [f"ymm{i}" for i in range(12)]
    assert "xmm16" not in source


def test_the_multiply_rate_probe_refuses_256_bit_companions_beside_an_accumulating_multiply(multiply_rate, capsys,
                                                                                             monkeypatch):
    monkeypatch.setitem(multiply_rate["main"].__globals__, "cpu_flags",
                        lambda: {"avx2", "avx512f", "avx512bw", "avx512_vnni"})
    with pytest.raises(SystemExit):
        multiply_rate["main"](["--instructions", "zmm-vpdpbusd", "--beside", "ymm-vpaddw"])
    assert "beside ['ymm-vpmaddubsw', 'ymm-vpmaddwd'] only (asked beside ['zmm-vpdpbusd'])" in \
        capsys.readouterr().err


def test_the_multiply_rate_probe_refuses_a_companion_it_does_not_know(multiply_rate, capsys, monkeypatch):
    monkeypatch.setitem(multiply_rate["main"].__globals__, "cpu_flags", lambda: {"avx2", "avx512f", "avx512bw"})
    with pytest.raises(SystemExit):
        multiply_rate["main"](["--instructions", "ymm-vpmaddubsw", "--beside", "vpdpwssd", "vfoo"])
    assert "['vpdpwssd', 'vfoo'] are not companions this CPU runs" in capsys.readouterr().err


@pytest.fixture(scope="module")
def roofline():
    import sys
    sys.path.insert(0, str(BENCH))  # it imports its neighbours multiply_rate and lean_step
    try:
        return runpy.run_path(str(BENCH / "verify_roofline.py"))
    finally:
        sys.path.remove(str(BENCH))


@pytest.mark.skipif(not quant.available() or not {"avx512f", "avx512bw", "avx512_vnni"} <= set(
    open("/proc/cpuinfo").read().split()) or shutil.which("objdump") is None,
                    reason="counts the built 512-bit group functions with objdump")
def test_the_roofline_counts_a_multiply_per_64_multiply_adds_in_the_built_group_functions(roofline):
    library = quant._quant.__file__
    family = roofline["FAMILIES"]["avx512-vnni"]
    for inputs in (1, 2, 5, 8):
        q4k = roofline["block_counts"](family.counted["Q4_K", "r16"], inputs, library)
        q6k = roofline["block_counts"](family.counted["Q6_K", "r16"], inputs, library)
        # single-stepped, one block's: Q4_K a scale multiply per 32 values and input, its mins on four vpdpwssd;
        # Q6_K a vpmaddubsw and a vpdpwssd (its scale) per 64, and the offsets' 8 vpdpwssd
        def ran(counts, mnemonic):  # with a register or a memory operand
            return counts.get(mnemonic, 0) + counts.get(mnemonic + " (memory)", 0)

        assert [ran(q4k, "vpdpbusd"), ran(q4k, "vpmulld"), ran(q4k, "vpdpwssd")] == [64 * inputs, 8 * inputs,
                                                                                    4 * inputs]
        assert [ran(q6k, "vpmaddubsw"), ran(q6k, "vpdpwssd"), ran(q6k, "vpdpbusd")] == [64 * inputs, 72 * inputs, 0]
    counts = {"vpdpbusd": 64, "vpmulld": 8, "vpandd": 32, "vmovdqu64 (memory)": 32, "vmovdqa32": 4,
              "vmovdqa32 (memory)": 10, "add": 9, "vfoo": 1}
    total, unweighed = roofline["slots"](counts, {"vpmulld": 1.0, "vpandd": 0.25, "vmovdqa32": 0.5})
    assert total == 64 + 8 + 8 + 2 and unweighed == ["vfoo"]  # loads, stores and scalar work take no slot
    group = roofline["FAMILIES"]["avx512-vnni"].counted["Q4_K", "r16"]  # R16_K_INPUTS a call
    assert group.split_inputs(19) == [8, 8, 3] and group.split_inputs(8) == [8]


@pytest.mark.skipif(not quant.available() or shutil.which("objdump") is None or {"avx512f", "avx512_vnni"} <= set(
    open("/proc/cpuinfo").read().split()), reason="needs a built 512-bit function this CPU cannot run, and objdump")
def test_the_roofline_stops_with_a_clear_error_on_an_instruction_the_cpu_lacks(roofline):
    # single-stepped, a faulting instruction would fault again at every step: the count must end, saying why
    with pytest.raises(RuntimeError, match="stopped on SIGILL in the counted call"):
        roofline["block_counts"](roofline["FAMILIES"]["avx512-vnni"].counted["Q4_K", "r16"], 1,
                                 quant._quant.__file__)


@pytest.mark.slow
@pytest.mark.skipif(not quant.available() or shutil.which("objdump") is None,
                    reason="counts the built avx2 functions with objdump")
def test_the_roofline_counts_a_vpmaddubsw_per_32_multiply_adds_in_the_built_avx2_functions(roofline):
    library = quant._quant.__file__
    family = roofline["FAMILIES"]["avx2"]

    def ran(counts, mnemonic):  # with a register or a memory operand
        return counts.get(mnemonic, 0) + counts.get(mnemonic + " (memory)", 0)

    for inputs in (1, 5):
        # a group of 16 rows: per 32 values and input one vpmaddubsw; per sub-block and input the scales' vpmaddwd
        # (8 a block and half) and the mins' 4 a block and half
        q4k = roofline["block_counts"](family.counted["Q4_K", "r16"], inputs, library)
        assert [ran(q4k, "vpmaddubsw"), ran(q4k, "vpmaddwd")] == [128 * inputs, 24 * inputs]
    for inputs in (1, 6):
        # a row: per 32 values and input one vpmaddubsw and its scales' vpmaddwd, and the offset's one a block
        q6k = roofline["block_counts"](family.counted["Q6_K", "rows"], inputs, library)
        assert [ran(q6k, "vpmaddubsw"), ran(q6k, "vpmaddwd")] == [8 * inputs, 9 * inputs]
    assert family.counted["Q4_K", "r16"].split_inputs(12) == [7, 5]  # R16_K_AVX2_INPUTS a call
    assert family.counted["Q6_K", "rows"].split_inputs(13) == [6, 6, 1]  # Q6K_AVX2_ROW_GROUP
    # the unit is vpmaddubsw itself; the rest weighed by the 256-bit companions measured beside it
    total, unweighed = roofline["slots"]({"vpmaddubsw (memory)": 8, "vpmaddwd": 9, "vpaddd": 8, "vmovdqu (memory)": 7,
                                          "vpbroadcastd (memory)": 2, "vpmovzxbd (memory)": 2, "vpmovzxbd": 1,
                                          "cmp": 5, "vfoo": 1},
                                         {"ymm-vpmaddwd": 1.0, "ymm-vpaddd": 0.25, "ymm-vpbroadcastd-load": 0.5,
                                          "ymm-vpmovzxbd-load": 0.5, "ymm-vpmovzxbd": 2.0}, family)
    # a widening from memory weighs as the measured widening load, from a register as the register form
    assert total == 8 + 9 + 2 + 1 + 1 + 2 and unweighed == ["vfoo"]
    assert roofline["family_for"]("avx2") is family
    assert roofline["family_for"]("avx512-vnni").kernel == roofline["family_for"]("amx").kernel == "avx512-vnni"
    with pytest.raises(SystemExit, match="run avx512-vnni-256"):
        roofline["family_for"]("avx512-vnni-256")


@pytest.mark.slow
@needs_product
def test_the_roofline_writes_its_floors_per_pass_size(roofline, files, tmp_path):
    if shutil.which("objdump") is None:
        pytest.skip("counts the built functions with objdump")
    out = tmp_path / "roofline.csv"
    roofline["main"](["--gguf", str(files["target"]), "--m", "1", "2", "9", "--repeats", "1", "--rounds", "2000",
                      "--pairs", "1", "--threads", "1", "--out", str(out)])
    frame = pd.read_csv(out)
    assert list(frame.m) == [1, 2, 9] and (frame.seconds > 0).all() and frame.over_m1[0] == 1.0
    assert frame.products_floor_s.is_monotonic_increasing and frame.attention_floor_s.is_monotonic_increasing
    assert (frame.least_over_m1 * frame.seconds[0] - frame[["bytes_floor_s"]].max(axis=1)).min() >= -1e-12
    assert roofline["verify_macs"](str(files["target"])) == {"Q4_K": 851968, "Q6_K": 344064}
    hot = pd.read_csv(tmp_path / "roofline.in_cache.csv")  # each type's products alone, in cache
    assert sorted(zip(hot.qtype, hot.m)) == [(q, m) for q in ("Q4_K", "Q6_K") for m in (1, 2, 9)]
    assert (hot.seconds > 0).all() and (hot.slots_floor_s > 0).all()


def test_the_roofline_refuses_pass_sizes_without_one_and_counts_below_one(roofline, capsys):
    with pytest.raises(SystemExit):
        roofline["main"](["--m", "2", "3"])
    assert "--m must include 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        roofline["main"](["--m", "1", "2", "--pairs", "0"])
    assert "--pairs and every --m must be at least 1" in capsys.readouterr().err
