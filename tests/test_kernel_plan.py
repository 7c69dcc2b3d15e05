"""The kernel plan (specdec/gguf/kernel_plan.py): a GGUF file's product kernel and per-class layouts, measured on this
machine at its first load, cached, recorded, and never a change of bits."""

import json

import pytest
import torch

from specdec.gguf import kernel_plan, quant
from specdec.gguf.kernel_plan import HEAD, KernelPlan
from specdec.gguf.lean import LeanLM, product_kernel
from specdec.gguf.model import read_gguf
from specdec.gguf.quant import QuantMatrix
from specdec.testing import tiny_gguf

pytestmark = pytest.mark.skipif(not quant.available(), reason="specdec.native._quant not available here")
TYPES = {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q6_K", "attn_output": "Q4_K", "ffn_gate": "Q4_K",
         "ffn_up": "Q4_K", "ffn_down": "Q6_K", "output": "Q6_K", "token_embd": "Q8_0"}


@pytest.fixture
def plans_on(tmp_path, monkeypatch):
    """Plans measured even for a tiny file, cached under tmp_path; the process's planned kernel reset after."""
    monkeypatch.setenv(kernel_plan.PLAN_ENV, "auto")
    monkeypatch.setenv(kernel_plan.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.delenv(quant.KERNEL_ENV, raising=False)
    monkeypatch.delenv(quant.LAYOUT_ENV, raising=False)
    monkeypatch.setattr(kernel_plan, "MIN_BYTES", 0)
    monkeypatch.setattr(kernel_plan, "REPEATS", 1)
    quant.set_planned_kernel(None)
    yield tmp_path
    quant.set_planned_kernel(None)


def logits(model) -> list[torch.Tensor]:
    session = LeanLM(model, max_length=64)
    tokens = list(range(3, 40))
    return [session.extend(tokens[:30], 1), session.extend(tokens[30:31], 1), session.extend(tokens[31:36], 5)]


def test_a_measured_plan_loads_the_file_in_its_layouts_is_cached_and_keeps_the_bits(plans_on, monkeypatch):
    path = tiny_gguf(plans_on / "m.gguf", types=TYPES, hidden=256, ffn=512)
    measured = read_gguf(path)
    plan = measured.plan
    assert plan.source == "measured" and plan.kernel in quant.kernels()
    assert set(plan.scores) == {"Q4_K", "Q6_K", HEAD}  # the layers' types and the head; the embedding is looked up
    every = {f"{k}/{layout}" for k in quant.kernels() for layout in quant.LAYOUTS}  # Q6_K's groups run on each
    assert set(plan.scores[HEAD]) == every and all(ms > 0 for ms in plan.scores[HEAD].values())
    assert measured.output.layout == plan.layouts[HEAD]
    assert measured.layers[0].up.layout == plan.layouts["Q4_K"] and measured.layers[1].down.layout == plan.layouts[
        "Q6_K"]
    assert quant.kernel_name() == plan.kernel  # the process runs the plan's kernel
    assert product_kernel(measured) == f"gguf-{plan.label()}"

    again = read_gguf(path)  # the second load reads the cache: no measurement
    assert again.plan.source == "cache" and again.plan.layouts == plan.layouts and again.plan.kernel == plan.kernel
    entries = json.loads(kernel_plan.cache_path().read_text())
    assert list(entries) == [kernel_plan.machine_key()]
    with monkeypatch.context() as rules:  # other rules of choosing: measured again
        rules.setattr(kernel_plan, "RULES", kernel_plan.RULES + 1)
        assert kernel_plan.cached_plan(path) is None and read_gguf(path).plan.source == "measured"

    monkeypatch.setenv(kernel_plan.PLAN_ENV, "off")
    quant.set_planned_kernel(None)
    default = read_gguf(path)
    assert default.plan.source == "default"
    with quant.use_kernel(plan.kernel):
        for a, b in zip(logits(measured), logits(default)):
            assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_a_corrupt_cache_is_measured_again_and_rewritten(plans_on):
    path = tiny_gguf(plans_on / "m.gguf", types=TYPES)
    cache = kernel_plan.cache_path()
    cache.parent.mkdir(parents=True)
    cache.write_text("{ not json")
    assert read_gguf(path).plan.source == "measured"
    assert kernel_plan.machine_key() in json.loads(cache.read_text())


def test_naming_a_kernel_or_turning_plans_off_skips_the_measurement(plans_on, monkeypatch):
    path = tiny_gguf(plans_on / "m.gguf", types=TYPES)
    monkeypatch.setenv(quant.KERNEL_ENV, "avx2")
    assert read_gguf(path).plan.source == "default" and not kernel_plan.cache_path().exists()
    monkeypatch.delenv(quant.KERNEL_ENV)
    with quant.use_kernel("avx2"):
        assert read_gguf(path).plan.source == "default"
    monkeypatch.setenv(kernel_plan.PLAN_ENV, "sometimes")
    with pytest.raises(ValueError, match="SPECDEC_KERNEL_PLAN='sometimes': expected 'auto', 'off' or 'remeasure'"):
        read_gguf(path)


def even_prompt(matrices) -> dict[str, float]:
    """A stand-in for the prompt pass's timing: every kernel alike (no prompt kernel)."""
    return {kernel: 10.0 for kernel in quant.kernels()}


def scores(times: dict[tuple[str, str], float], at_rows: dict[int, dict[tuple[str, str], float]] | None = None):
    """A stand-in for the timing: every candidate's score 10 ms unless named, split evenly over the row counts; or,
    per row count, the times in at_rows (10 ms unless named)."""
    def fake(matrices, candidates, inputs):
        if at_rows is not None:
            return {c: {m: at_rows[m].get(c, 10.0) for m in kernel_plan.ROWS} for c in candidates}
        return {c: {m: times.get(c, 10.0) / len(kernel_plan.ROWS) for m in kernel_plan.ROWS} for c in candidates}
    return fake


@pytest.mark.skipif(len(quant.kernels()) < 2, reason="one kernel: nothing to choose")
def test_the_default_stays_unless_a_candidate_is_clearly_faster(plans_on, monkeypatch):
    """The choice itself, on given timings: a tie or a gain under MARGIN keeps the default (the last kernel, groups
    of 16 rows); a clear gain takes the candidate, per class for layouts and over all classes for the kernel."""
    matrices = {"Q4_K": [quant.random_quant_matrix("Q4_K", 32, 256)], HEAD: [quant.random_quant_matrix("Q6_K", 32,
                                                                                                       256)]}
    last, other = quant.kernels()[-1], quant.kernels()[-2]
    monkeypatch.setattr(kernel_plan, "_time_prompt", even_prompt)
    monkeypatch.setattr(kernel_plan, "_time_class", scores({}))
    plan = kernel_plan.measure(plans_on / "x.gguf", matrices)
    assert plan.kernel == last and plan.layouts == {"Q4_K": "r16", HEAD: "r16"}
    monkeypatch.setattr(kernel_plan, "_time_class", scores({(last, "rows"): 9.9, (other, "r16"): 9.9}))
    plan = kernel_plan.measure(plans_on / "x.gguf", matrices)  # 1% faster: noise, not a reason
    assert plan.kernel == last and plan.layouts == {"Q4_K": "r16", HEAD: "r16"}
    monkeypatch.setattr(kernel_plan, "_time_class", scores({(last, "rows"): 8.0}))
    plan = kernel_plan.measure(plans_on / "x.gguf", matrices)
    assert plan.kernel == last and plan.layouts == {"Q4_K": "rows", HEAD: "rows"}
    monkeypatch.setattr(kernel_plan, "_time_class", scores({(other, "r16"): 8.0}))
    plan = kernel_plan.measure(plans_on / "x.gguf", matrices)
    assert plan.kernel == other and plan.layouts == {"Q4_K": "r16", HEAD: "r16"}


def test_a_class_faster_in_other_layouts_at_one_row_and_at_four_keeps_both(plans_on, monkeypatch):
    """Every class faster in rows at 1 row and in groups at 4 (each by more than MARGIN), the head too: the plan
    keeps both, rows for a step and groups for a verify pass; a gain under MARGIN keeps one."""
    matrices = {"Q4_K": [quant.random_quant_matrix("Q4_K", 32, 256)],
                "Q6_K": [quant.random_quant_matrix("Q6_K", 32, 256)], HEAD: [quant.random_quant_matrix("Q6_K", 32,
                                                                                                       256)]}
    last = quant.kernels()[-1]
    if last == "avx2":
        pytest.skip("no grouped layout on this machine's kernels")
    one, many = kernel_plan.ROWS[0], kernel_plan.ROWS[-1]
    monkeypatch.setattr(kernel_plan, "_time_prompt", even_prompt)
    monkeypatch.setattr(kernel_plan, "_time_class", scores({}, {one: {(last, "rows"): 8.0}, many: {}}))
    plan = kernel_plan.measure(plans_on / "x.gguf", matrices)
    assert plan.kernel == last
    assert plan.layouts == {"Q4_K": "rows", "Q6_K": "rows", HEAD: "rows"}
    assert plan.verify_layouts == {"Q4_K": "r16", "Q6_K": "r16", HEAD: "r16"}
    assert plan.verify_layout("Q6_K", "Q6_K", 32) == "r16" and plan.verify_layout(HEAD, "Q6_K", 32) == "r16"
    assert plan.verify_layout("Q6_K", "Q6_K", 24) is None  # no whole groups of 16: the one copy
    assert plan.as_record()["verify_layouts"] == {"Q4_K": "r16", "Q6_K": "r16", HEAD: "r16"}
    assert plan.label() == f"{last}+verify-Q4_K-r16+verify-Q6_K-r16+verify-head-r16"
    monkeypatch.setattr(kernel_plan, "_time_class", scores({}, {one: {(last, "rows"): 9.9}, many: {}}))
    assert kernel_plan.measure(plans_on / "x.gguf", matrices).verify_layouts == {}  # 1%: noise, one copy


def test_a_model_with_verify_layouts_runs_them_on_passes_of_several_rows_with_the_same_bits(plans_on, monkeypatch):
    """A plan naming Q6_K and the head in rows for a step and in groups for a verify pass: the model keeps a second
    copy of the Q6_K products and of the head, sessions run them (fused and Python forward) on passes of 2 rows or
    more (the head: of 2 logits or more), and every logit is the bits of a model in one layout, at 1, 3 and 5 rows;
    the cache round-trips the verify layouts."""
    import specdec.gguf.model as model_module

    kernel = quant.kernels()[-1]
    if kernel == "avx2":
        pytest.skip("no grouped layout on this machine's kernels")
    path = tiny_gguf(plans_on / "m.gguf", types=TYPES, hidden=256, ffn=512)
    forced = KernelPlan(kernel, {"Q4_K": "r16", "Q6_K": "rows", HEAD: "rows"},
                        verify_layouts={"Q6_K": "r16", HEAD: "r16"}, source="measured")
    monkeypatch.setattr(model_module, "plan_for", lambda path, classes: forced)
    model = read_gguf(path)
    assert model.layers[1].down.layout == "rows" and model.verify_layers[1].down.layout == "r16"
    assert model.verify_layers[1].gate_up[0] is model.layers[1].gate_up[0]  # Q4_K: one copy
    assert model.layers_for(1) is model.layers and model.layers_for(3) is model.verify_layers
    assert model.output.layout == "rows" and model.verify_output.layout == "r16"
    assert model.head_for(1) is model.output and model.head_for(3) is model.verify_output
    monkeypatch.setattr(model_module, "plan_for", lambda path, classes: KernelPlan(kernel, {"Q4_K": "r16",
                                                                                          "Q6_K": "rows",
                                                                                          HEAD: "rows"}))
    single = read_gguf(path)
    assert single.verify_layers is None and single.verify_output is None and single.head_for(3) is single.output
    heads = []  # the head each pass ran
    original = QuantMatrix.matmul
    monkeypatch.setattr(QuantMatrix, "matmul", lambda self, *a, **k: heads.append(self) or original(self, *a, **k))
    with quant.use_kernel(kernel):
        for fused in (True, False):
            a, b = LeanLM(model, max_length=64, fused=fused), LeanLM(single, max_length=64, fused=fused)
            for tokens in ([3, 4, 5, 6, 7], [8], [9, 10, 11], [12], [13, 14, 15, 16, 17]):
                heads.clear()
                x = a.extend(tokens, len(tokens))
                assert heads[-1] is (model.output if len(tokens) == 1 else model.verify_output)
                y = b.extend(tokens, len(tokens))
                assert torch.equal(x.view(torch.int32), y.view(torch.int32))
        session = LeanLM(model, max_length=64)
        assert session._fused_verify is not session._fused
        session.limit_head_vocab(64)  # a draft's head: one copy, limited, for every pass
        heads.clear()
        session.extend([3, 4, 5], 3)
        assert heads[-1].out_features == 64 and heads[-1] is not model.verify_output
    assert kernel_plan.cached_plan(path) is None  # the forced plan was never measured, so never cached
    entries = {kernel_plan.machine_key(): {kernel_plan._file_key(path): forced.as_record()}}
    kernel_plan._write_cache(entries)
    assert kernel_plan.cached_plan(path).verify_layouts == {"Q6_K": "r16", HEAD: "r16"}


def test_the_label_names_each_class_off_the_layers_layout():
    assert KernelPlan("amx", {"Q4_K": "r16", "Q6_K": "r16", HEAD: "rows"}).label() == "amx-r16+head-rows"
    assert KernelPlan("avx512-vnni-256", {"Q5_0": "r16", "Q6_K": "rows", HEAD: "r16"}).label() == \
        "avx512-vnni-256-r16+Q6_K-rows"
    assert KernelPlan("avx2", {"Q4_K": "rows", HEAD: "rows"}).label() == "avx2"
    assert KernelPlan("avx2", {"Q4_K": "r16", HEAD: "rows"}, prompt_kernel="amx").label() == \
        "avx2-r16+head-rows+prompt-amx"
    plan = KernelPlan("avx2", {"Q4_K": "r16"}, verify_kernel="avx512-vnni", prompt_kernel="amx")
    assert plan.label() == "avx2-r16+verify-avx512-vnni+prompt-amx"
    assert [plan.pass_kernel(1, False), plan.pass_kernel(5, False), plan.pass_kernel(40, True)] == \
        ["avx2", "avx512-vnni", "amx"]
    assert KernelPlan("avx2").pass_kernel(5, False) == KernelPlan("avx2").pass_kernel(40, True) == "avx2"


def test_provenance_records_the_plan_a_file_loads_with(plans_on):
    from specdec.study.provenance import model_record

    path = tiny_gguf(plans_on / "m.gguf", types=TYPES)
    assert model_record(path)["kernel_plan"] is None  # never loaded here: no plan to report
    plan = read_gguf(path).plan
    quant.set_planned_kernel(None)  # as in a later process
    record = model_record(path)["kernel_plan"]
    assert record["label"] == plan.label() and record["layouts"] == plan.layouts and record["source"] == "cache"
    assert set(record["scores_ms"]) == {"Q4_K", "Q6_K", HEAD}


def test_provenance_finds_the_plan_of_the_runs_thread_count_from_a_job_of_another(plans_on):
    """The side-by-side's table job runs on one thread while its runs used two: the record must name the runs' plan
    (a plan is cached per thread count), not report none."""
    from specdec.study.provenance import kernel_plan_record

    path = tiny_gguf(plans_on / "m.gguf", types=TYPES)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        plan = read_gguf(path).plan
        quant.set_planned_kernel(None)
        torch.set_num_threads(1)
        assert kernel_plan_record(path) is None  # this process's own count: never measured
        record = kernel_plan_record(path, threads=2)
        assert record["label"] == plan.label() and record["layouts"] == plan.layouts
    finally:
        torch.set_num_threads(before)


def test_a_jobs_plans_are_recorded_file_by_file_each_its_own(plans_on):
    """A side-by-side job loads the target and its drafts, each measured on every kernel (its sessions run its own
    plan's): the record names each file's cached plan, whatever the other files chose."""
    from specdec.study.provenance import kernel_plan_records

    target, draft = tiny_gguf(plans_on / "t.gguf", types=TYPES), tiny_gguf(plans_on / "d.gguf", types=TYPES, seed=1)
    plan = {"source": "measured", "scores_ms": {}}
    entries = {kernel_plan.machine_key(2): {
        kernel_plan._file_key(target): {**plan, "kernel": quant.kernels()[0], "layouts": {"Q4_K": "rows"}},
        kernel_plan._file_key(draft): {**plan, "kernel": quant.kernels()[-1], "layouts": {"Q4_K": "r16"},
                                       "prompt_kernel": quant.kernels()[0]}}}
    kernel_plan._write_cache(entries)
    records = kernel_plan_records({"t": target, "d": draft}, threads=2)
    assert records["t"]["layouts"] == {"Q4_K": "rows"} and records["t"]["kernel"] == quant.kernels()[0]
    assert records["d"]["kernel"] == quant.kernels()[-1] and records["d"]["prompt_kernel"] == quant.kernels()[0]
    assert kernel_plan_records({"d": draft}, threads=2)["d"] == records["d"]


@pytest.mark.skipif(len(quant.kernels()) < 2, reason="one kernel: nothing to choose")
def test_a_later_file_is_measured_on_every_kernel_not_the_earlier_files(plans_on, monkeypatch):
    """The first plan sets the process's kernel (for products outside a session); a second file is still timed on
    every kernel and keeps its own choice."""
    first, other = quant.kernels()[-1], quant.kernels()[0]
    quant.set_planned_kernel(first)
    monkeypatch.setattr(kernel_plan, "_time_class", scores({(other, "rows"): 5.0}))
    monkeypatch.setattr(kernel_plan, "_time_prompt", even_prompt)
    plan = read_gguf(tiny_gguf(plans_on / "d.gguf", types=TYPES, seed=1)).plan
    assert plan.kernel == other and {c.split("/")[0] for c in plan.scores["Q4_K"]} == set(quant.kernels())
    assert quant.planned_kernel() == first  # the process's stays the first plan's


@pytest.mark.skipif(len(quant.kernels()) < 2, reason="one kernel: nothing to choose")
def test_a_prompt_kernel_is_kept_only_where_clearly_faster_at_many_rows(plans_on, monkeypatch):
    """Given timings at PROMPT_ROWS: a kernel faster than the plan's by more than MARGIN becomes its prompt kernel
    (named in the label and the cache); a gain under MARGIN, or the plan's own kernel fastest, keeps none."""
    matrices = {"Q4_K": [quant.random_quant_matrix("Q4_K", 32, 256)], HEAD: [quant.random_quant_matrix("Q6_K", 32,
                                                                                                       256)]}
    last, other = quant.kernels()[-1], quant.kernels()[0]
    monkeypatch.setattr(kernel_plan, "_time_class", scores({}))
    timed = []
    for prompt_times, expected in (({other: 5.0}, other), ({other: 9.9}, None), ({last: 5.0}, None)):
        def fake(laid, prompt_times=prompt_times):
            timed.append(laid)
            return {k: prompt_times.get(k, 10.0) for k in quant.kernels()}
        monkeypatch.setattr(kernel_plan, "_time_prompt", fake)
        plan = kernel_plan.measure(plans_on / "x.gguf", matrices)
        assert plan.kernel == last and plan.prompt_kernel == expected
        assert plan.label().endswith(f"+prompt-{other}") == (expected is not None)
        assert plan.as_record().get("prompt_kernel") == expected
    assert [m.qtype for m in timed[0]] == ["Q4_K"]  # the layers' classes only: a prompt pass computes one logit


@pytest.mark.skipif(len(quant.kernels()) < 2, reason="one kernel: nothing to choose")
def test_a_verify_kernel_is_kept_where_clearly_faster_at_four_rows_in_the_same_layouts(plans_on, monkeypatch):
    """A kernel slow at one row and clearly faster at four (in the layouts the plan chose on its kernel) becomes the
    verify kernel; the step's kernel stays the one fastest over both; a gain under MARGIN keeps none."""
    matrices = {"Q4_K": [quant.random_quant_matrix("Q4_K", 32, 256)], HEAD: [quant.random_quant_matrix("Q6_K", 32,
                                                                                                       256)]}
    last, other = quant.kernels()[-1], quant.kernels()[0]
    monkeypatch.setattr(kernel_plan, "_time_prompt", even_prompt)
    one, many = kernel_plan.ROWS[0], kernel_plan.ROWS[-1]
    slow_step = {(other, layout): 20.0 for layout in quant.LAYOUTS}
    for at_many, expected in ((5.0, other), (9.8, None)):
        fast_verify = {(other, layout): at_many for layout in quant.LAYOUTS}
        monkeypatch.setattr(kernel_plan, "_time_class", scores({}, {one: slow_step, many: fast_verify}))
        plan = kernel_plan.measure(plans_on / "x.gguf", matrices)
        assert plan.kernel == last and plan.verify_kernel == expected
        assert plan.pass_kernel(4, False) == (expected or last) and plan.pass_kernel(1, False) == last
        assert plan.as_record().get("verify_kernel") == expected


@pytest.mark.skipif(len(quant.kernels()) < 2, reason="one kernel: nothing to choose")
def test_each_session_runs_its_own_plans_kernel_and_a_prompt_its_prompt_kernel_with_the_same_bits(plans_on,
                                                                                                   monkeypatch):
    """Two files whose cached plans name different kernels, one with a verify kernel, one with a prompt kernel: every
    product of a session's pass runs on its own model's kernel for that pass (a prompt, of more than INVARIANT_ROWS
    rows, on the prompt kernel; a pass of 2 rows or more on the verify kernel), on the fused and the Python forward,
    whatever the process's kernel, but the head (the last product) on the kernel for its own rows, the logits asked
    for (one logit: a step's kernel); use_kernel still overrides; the logits are the bits of one kernel throughout."""
    from specdec.native.attention import INVARIANT_ROWS

    first, other = quant.kernels()[-1], quant.kernels()[0]
    a, b = tiny_gguf(plans_on / "a.gguf", types=TYPES), tiny_gguf(plans_on / "b.gguf", types=TYPES)
    record = {"source": "measured", "scores_ms": {}, "layouts": {}}
    kernel_plan._write_cache({kernel_plan.machine_key(): {
        kernel_plan._file_key(a): {**record, "kernel": first, "verify_kernel": other},
        kernel_plan._file_key(b): {**record, "kernel": other, "prompt_kernel": first}}})
    model_a, model_b = read_gguf(a), read_gguf(b)
    assert quant.planned_kernel() == first and model_b.plan.prompt_kernel == first
    ran = []  # the kernel each product (and fused call) asked for
    original = quant.kernel_name
    monkeypatch.setattr(quant, "kernel_name", lambda: ran.append(original()) or ran[-1])
    prompt = list(range(3, 3 + INVARIANT_ROWS + 4))
    for fused in (True, False):
        session_a, session_b = LeanLM(model_a, max_length=128, fused=fused), LeanLM(model_b, max_length=128,
                                                                                   fused=fused)
        # tokens, logits, then for a and for b: the layers' kernel and the head's
        for tokens, logits, expected_a, expected_b in ((prompt, 1, (first, first), (first, other)),
                                                       ([50], 1, (first, first), (other, other)),
                                                       ([51, 52, 53], 1, (other, first), (other, other)),
                                                       ([54, 55, 56], 3, (other, other), (other, other))):
            for session, (layers, head) in ((session_b, expected_b), (session_a, expected_a)):
                ran.clear()
                session.extend(tokens, logits)
                assert len(ran) > 1 and set(ran[:-1]) == {layers} and ran[-1] == head, (tokens, logits, fused, ran)
        with quant.use_kernel(other):
            ran.clear()
            session_a.extend([57], 1)
            assert set(ran) == {other}
    monkeypatch.setattr(quant, "kernel_name", original)
    with quant.use_kernel(first):  # the same bits as one kernel throughout
        reference = LeanLM(model_b, max_length=128)
        expected = [reference.extend(prompt, 1), reference.extend([50], 1), reference.extend([51, 52, 53], 3)]
    session = LeanLM(model_b, max_length=128)
    got = [session.extend(prompt, 1), session.extend([50], 1), session.extend([51, 52, 53], 3)]
    for x, y in zip(got, expected):
        assert torch.equal(x.view(torch.int32), y.view(torch.int32))
