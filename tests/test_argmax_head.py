"""The exact argmax head (specdec/gguf/argmax_head.py, specdec/native/_quant_hi4.h): its packing, its bound, the
candidates' exact logits, and greedy decoding through it."""

import numpy as np
import pytest
import torch

from specdec.decode import generate_baseline, generate_speculative
from specdec.drafts import ModelDraft
from specdec.gguf import argmax_head, quant
from specdec.gguf.argmax_head import ArgmaxHead
from specdec.gguf.lean import LeanLM
from specdec.load import load_target
from specdec.gguf.model import read_gguf
from specdec.runtime import Runtime
from specdec.testing import DRAFT_TYPES, at_threads, tiny_gguf, tiny_gguf_with_tokenizer

pytestmark = pytest.mark.skipif(not quant.available(), reason="specdec.native._quant (the quantized product) not built")


def q6k_fields(raw: np.ndarray, in_features: int):
    """A Q6_K matrix's quants q (0..63), int8 scales per 16 values and fp16 d per block, as ggml lays them out."""
    blocks = raw.reshape(raw.shape[0], in_features // 256, 210)
    ql, qh = blocks[..., :128].astype(np.int64), blocks[..., 128:192].astype(np.int64)
    q = np.zeros(blocks.shape[:2] + (256,), np.int64)
    for half in range(2):
        low, high = ql[..., 64 * half:64 * half + 64], qh[..., 32 * half:32 * half + 32]
        for part, (source, shift) in enumerate([(low[..., :32] & 15, 0), (low[..., 32:] & 15, 2),
                                                (low[..., :32] >> 4, 4), (low[..., 32:] >> 4, 6)]):
            q[..., 128 * half + 32 * part:128 * half + 32 * part + 32] = source | ((high >> shift) & 3) << 4
    scales = blocks[..., 192:208].view(np.int8).astype(np.int64)
    d = blocks[..., 208:210].copy().view(np.float16).astype(np.float64)[..., 0]
    return q, scales, d


def quantize_q8k(x: np.ndarray):
    """quantize_row_k's activations: per 256 values q = round(x * 127 / amax) (ties to even), d = amax / 127."""
    blocks = x.astype(np.float32).reshape(x.shape[0], -1, 256)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    inverse = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint((blocks * inverse).astype(np.float32)).astype(np.int64)
    return q, (amax[..., 0] / np.float32(127)).astype(np.float32).astype(np.float64)


def reference(weight: quant.QuantMatrix, x: torch.Tensor):
    """The header's approximate outputs and bounds in float64 from the formulas (integers exact, then one float
    product a block)."""
    q, scales, d = q6k_fields(weight.in_layout("rows").raw.numpy(), weight.in_features)
    a, da = quantize_q8k(x.numpy())
    hi = (q >> 2).reshape(q.shape[0], q.shape[1], 16, 16)
    a16 = a.reshape(a.shape[0], a.shape[1], 16, 16)
    dots = np.einsum("nbsj,mbsj->mnbs", hi, a16)  # the four bits times the quants, per 16
    integer = (scales[None] * (8 * dots - 61 * a16.sum(-1)[:, None])).sum(-1)  # I per block
    limit = (np.abs(scales)[None] * np.abs(a16).sum(-1)[:, None]).sum(-1)
    scale = d[None] * da[:, None]
    return (scale * integer).sum(-1) / 2, 1.5 * (np.abs(scale) * limit).sum(-1)


SHAPES = [(37, 256, 1), (64, 512, 3), (300, 1536, 2), (129, 768, 9)]  # ragged rows, 1-9 inputs


@pytest.mark.parametrize("rows, columns, inputs", SHAPES)
def test_the_packed_blocks_hold_each_quants_top_four_bits_and_the_blocks_scales(rows, columns, inputs):
    weight = quant.random_quant_matrix("Q6_K", rows, columns, seed=rows)
    packed = ArgmaxHead(weight).hi4.numpy().reshape(rows, columns // 256, 146)
    q, _, _ = q6k_fields(weight.raw.numpy(), columns)
    raw = weight.raw.numpy().reshape(rows, columns // 256, 210)
    assert np.array_equal(packed[..., :2], raw[..., 208:210]) and np.array_equal(packed[..., 2:18], raw[..., 192:208])
    nibbles = np.concatenate([packed[..., 18:] & 15, packed[..., 18:] >> 4], axis=-1)
    assert np.array_equal(nibbles, q >> 2)


@pytest.mark.parametrize("rows, columns, inputs", SHAPES)
def test_the_first_pass_is_the_formulas_and_bounds_the_q6k_product_on_every_kernel_and_thread_count(rows, columns,
                                                                                                    inputs):
    weight = quant.random_quant_matrix("Q6_K", rows, columns, seed=columns)
    head = ArgmaxHead(weight)
    x = torch.randn(inputs, columns, generator=torch.Generator().manual_seed(inputs)) * 3
    want_approx, want_bound = reference(weight, x)
    first = None
    for kernel in quant.kernels():
        for threads in (1, 2):
            with quant.use_kernel(kernel):
                approx, bound = at_threads(threads, lambda: head.bounds(x))
                full = at_threads(threads, lambda: weight.matmul(x))
            if first is None:
                first = approx, bound
                np.testing.assert_allclose(approx.double().numpy(), want_approx, rtol=1e-5,
                                           atol=1e-5 * np.abs(want_approx).max())
                np.testing.assert_allclose(bound.double().numpy(), want_bound * (1 + argmax_head.BOUND_MARGIN),
                                           rtol=1e-5)
            # the same bits on every kernel and thread count, and each input's alone as in the batch
            assert torch.equal(approx, first[0]) and torch.equal(bound, first[1]), (kernel, threads)
            assert ((full - approx).abs() <= bound).all(), (kernel, threads)
    alone = head.bounds(x[-1:])
    assert torch.equal(alone[0][0], first[0][-1]) and torch.equal(alone[1][0], first[1][-1])


def test_the_bound_is_needed_whole_a_tenth_of_it_is_broken():
    """The check above can fail: with the bound cut to a tenth, rows fall outside it."""
    weight = quant.random_quant_matrix("Q6_K", 300, 1536, seed=3)
    x = torch.randn(3, 1536, generator=torch.Generator().manual_seed(1))
    approx, bound = ArgmaxHead(weight).bounds(x)
    assert not ((weight.matmul(x) - approx).abs() <= bound / 10).all()


def peaked_inputs(weight: quant.QuantMatrix, winners: list[int], scale: float = 40.0) -> torch.Tensor:
    """Inputs along rows `winners` of the matrix (each its own row's logit far above the rest), plus noise."""
    rows = weight.dequantize_rows(winners)
    noise = torch.randn(rows.shape, generator=torch.Generator().manual_seed(len(winners)))
    return scale * rows / rows.norm(dim=1, keepdim=True) + noise * 0.05


@pytest.mark.parametrize("kernel", quant.kernels())
def test_the_logits_argmax_is_the_full_heads_with_the_candidates_exact_and_few(kernel):
    weight = quant.random_quant_matrix("Q6_K", 4096, 512, seed=7)
    head = ArgmaxHead(weight)
    x = peaked_inputs(weight, [5, 4000, 1234])
    with quant.use_kernel(kernel):
        full, logits = weight.matmul(x), head.logits(x)
    assert torch.equal(logits.argmax(dim=1), full.argmax(dim=1)) and logits.argmax(dim=1).tolist() == [5, 4000, 1234]
    kept = torch.isfinite(logits)
    assert torch.equal(logits[kept], full[kept])  # the candidates' logits are the Q6_K product's bits
    assert head.last_candidates == kept.sum(dim=1).tolist() and max(head.last_candidates) < 4096 * 0.25
    assert head.full_head_calls == 0


@pytest.mark.parametrize("kernel", quant.kernels())
def test_inputs_sharing_some_candidates_get_each_its_own_rows_exact(kernel, threads):
    """Rows that are candidates of some inputs and not others (hi4_exact_rows multiplies each row by its own inputs
    only, threads splitting the rows): every input's candidates carry the full head's bits for that input, every
    other logit is -inf."""
    weight = quant.random_quant_matrix("Q6_K", 2048, 512, seed=11)
    head = ArgmaxHead(weight)
    x = peaked_inputs(weight, [7, 1500, 7, 300, 1500, 7], scale=12.0)  # shared winners, each input its own noise
    with quant.use_kernel(kernel):
        full, logits = weight.matmul(x), head.logits(x)
    kept = torch.isfinite(logits)
    assert torch.equal(logits.argmax(dim=1), full.argmax(dim=1))
    assert torch.equal(logits[kept], full[kept]) and head.last_candidates == kept.sum(dim=1).tolist()
    shared = kept.any(dim=0)  # the union: some of its rows are not every input's
    assert (kept[:, shared].sum(dim=0) < x.shape[0]).any() and (kept[:, shared].sum(dim=0) > 1).any()


def test_tied_rows_are_all_candidates_and_the_first_wins_as_torch_argmax_says():
    weight = quant.random_quant_matrix("Q6_K", 2048, 256, seed=9)
    raw = weight.raw.clone()
    raw[1500] = raw[700]  # rows 700 and 1500 equal: their logits tie exactly
    weight = quant.QuantMatrix(raw, "Q6_K", 256)
    x = peaked_inputs(weight, [700])
    logits, full = ArgmaxHead(weight).logits(x), weight.matmul(x)
    assert logits[0, 700] == logits[0, 1500] == full[0].max()
    assert int(logits.argmax()) == int(full.argmax()) == 700


def test_a_flat_distribution_runs_the_whole_head():
    weight = quant.random_quant_matrix("Q6_K", 512, 256, seed=2)
    head = ArgmaxHead(weight)
    x = torch.zeros(2, 256)  # every logit 0, every bound 0: every row a candidate
    assert torch.equal(head.logits(x), weight.matmul(x)) and head.full_head_calls == 1
    assert head.last_candidates == [512, 512]


def test_a_nan_input_gets_the_full_heads_argmax():
    """Both products quantise the activation row the same way, whatever it holds, so the bound still holds."""
    weight = quant.random_quant_matrix("Q6_K", 256, 256, seed=4)
    x = torch.randn(2, 256) * 3
    x[0, 7] = float("nan")
    assert torch.equal(ArgmaxHead(weight).logits(x).argmax(dim=1), weight.matmul(x).argmax(dim=1))


def test_bad_heads_and_calls_are_refused_before_any_work():
    with pytest.raises(ValueError, match="Q6_K LM head, got Q8_0"):
        ArgmaxHead(quant.random_quant_matrix("Q8_0", 64, 256))
    head = ArgmaxHead(quant.random_quant_matrix("Q6_K", 64, 256))
    with pytest.raises(ValueError, match="256"):
        head.logits(torch.randn(1, 512))
    index = torch.tensor([3, 64])  # 64: past the matrix
    member = torch.ones(1, 64, dtype=torch.uint8)
    x, y = torch.randn(1, 256), torch.empty(1, 64)
    with pytest.raises(IndexError, match="row 64 is outside the matrix's 64 rows"):
        quant._quant.hi4_exact_rows(head.rows.raw.data_ptr(), 210, index.data_ptr(), member.data_ptr(), 2,
                                    x.data_ptr(), y.data_ptr(), 64, 256, 1, 1, quant.kernel_name())
    with pytest.raises(ValueError, match="multiple of 256"):
        quant._quant.hi4_matmul(head.hi4.data_ptr(), x.data_ptr(), y.data_ptr(), y.data_ptr(), 64, 100, 1, 1,
                                quant.kernel_name())


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("argmax-head")
    return {"target": tiny_gguf(root / "target.gguf", vocab_size=2048, norm_scale=(0.1, 0.003)),
            "draft": tiny_gguf(root / "draft.gguf", vocab_size=2048, layers=1, norm_scale=(0.1,)),
            # with a vocabulary in the file, as the loaders want
            "with_vocabulary": tiny_gguf_with_tokenizer(root / "vocab.gguf", layers=1),
            "q8_head": tiny_gguf_with_tokenizer(root / "q8.gguf", types=DRAFT_TYPES, layers=1)}


def sessions(path):
    model = read_gguf(path)
    full, fast = LeanLM(model, max_length=128), LeanLM(model, max_length=128)
    fast.use_argmax_head()
    return full, fast


def test_greedy_decoding_through_the_argmax_head_gives_the_same_tokens_and_turns_it_off_after(files):
    full, fast = sessions(files["target"])
    prompt = torch.tensor([[3, 17, 99, 250, 1000, 42]])
    plain = generate_baseline(full, prompt, 40)
    assert generate_baseline(fast, prompt, 40).tokens == plain.tokens and len(plain.tokens) > 1
    assert fast.argmax_only is False  # restored after the run
    # the fast path ran: some steps computed only their candidates' rows
    assert len(fast.argmax_head.candidates) >= len(plain.tokens) - 1
    assert fast.argmax_head.full_head_calls < len(fast.argmax_head.candidates)
    draft = ModelDraft(LeanLM(read_gguf(files["draft"]), max_length=128))
    assert generate_speculative(fast, draft, prompt, 3, 40).tokens == plain.tokens


def test_sampling_keeps_every_logit_with_the_head_built(files):
    full, fast = sessions(files["target"])
    prompt = torch.tensor([[5, 6, 7]])
    calls = len(fast.argmax_head.candidates)
    sampled = generate_baseline(fast, prompt, 20, temperature=0.9, seed=4)
    assert sampled.tokens == generate_baseline(full, prompt, 20, temperature=0.9, seed=4).tokens
    assert len(fast.argmax_head.candidates) == calls  # never asked
    fast.set_argmax_only(True)  # on by hand, a pass of one logit gives -inf where a row cannot win
    assert torch.isinf(fast.extend([5, 6], 1)).any()


def test_the_runtime_builds_it_for_a_q6k_target_head_and_refuses_it_elsewhere(files):
    runtime = Runtime(weights="gguf", argmax_head=True)
    session, _ = load_target(files["with_vocabulary"], runtime)
    assert session.argmax_head.nbytes == session.vocab_size * 146  # one 256-value block a row
    assert load_target(files["with_vocabulary"], Runtime(weights="gguf"))[0].argmax_head is None
    with pytest.raises(ValueError, match="needs a Q6_K LM head; .*q8.gguf's is Q8_0"):
        load_target(files["q8_head"], runtime)
    with pytest.raises(ValueError, match="argmax_head .* needs weights 'gguf'"):
        Runtime(argmax_head=True)
    limited = LeanLM(read_gguf(files["target"]), max_length=16)
    limited.limit_head_vocab(512)
    with pytest.raises(ValueError, match="whole head"):
        limited.use_argmax_head()
    built = LeanLM(read_gguf(files["target"]), max_length=16)
    built.use_argmax_head()
    for option, value in (("limit_head_vocab", 512), ("requantize_head", "Q5_0")):
        with pytest.raises(ValueError, match=f"{option}: .*do not mix"):
            getattr(built, option)(value)


def grouped_fields(packed: np.ndarray, rows: int, blocks: int):
    """d, scales and top bits read back from Q6_K_HI4 groups of 16 rows as _quant_hi4.h lays them out."""
    groups = packed.reshape(rows // 16, blocks, 16 * 146)
    d = groups[..., :32].copy().view(np.float16).reshape(rows // 16, blocks, 16)
    scales = groups[..., 32:288].view(np.int8).reshape(rows // 16, blocks, 16, 16)  # [sub-block][row]
    pieces = groups[..., 288:].reshape(rows // 16, blocks, 8, 4, 16, 4)  # [p][k][row][j]
    hi = np.zeros((rows // 16, blocks, 16, 256), np.int64)
    for p in range(8):
        for k in range(4):
            for j in range(4):
                hi[..., 16 * p + 4 * k + j] = pieces[:, :, p, k, :, j] & 15
                hi[..., 128 + 16 * p + 4 * k + j] = pieces[:, :, p, k, :, j] >> 4
    as_rows = lambda a: np.moveaxis(a, 2, 1).reshape(rows, blocks, *a.shape[3:])  # noqa: E731
    return as_rows(d[..., None])[..., 0], np.moveaxis(scales, 3, 1).reshape(rows, blocks, 16), as_rows(hi)


@pytest.mark.parametrize("rows, columns", [(16, 256), (64, 512), (320, 1536)])
def test_the_grouped_top_bits_hold_each_rows_d_scales_and_four_bits(rows, columns):
    weight = quant.random_quant_matrix("Q6_K", rows, columns, seed=rows + 1)
    head = ArgmaxHead(weight)
    assert head.grouped and head.max_rows == argmax_head.GROUPED_MAX_ROWS
    d, scales, hi = grouped_fields(head.hi4_groups.numpy(), rows, columns // 256)
    q, want_scales, want_d = q6k_fields(weight.raw.numpy(), columns)
    assert np.array_equal(d.astype(np.float64), want_d) and np.array_equal(scales, want_scales)
    assert np.array_equal(hi, q >> 2)


@pytest.mark.parametrize("rows, columns, inputs", [(16, 256, 1), (64, 512, 3), (320, 1536, 9), (128, 768, 17)])
def test_the_grouped_first_pass_is_the_formulas_bounds_the_product_and_keeps_each_inputs_bits(rows, columns, inputs):
    weight = quant.random_quant_matrix("Q6_K", rows, columns, seed=columns + inputs)
    head = ArgmaxHead(weight)
    x = torch.randn(inputs, columns, generator=torch.Generator().manual_seed(inputs)) * 3
    want_approx, want_bound = reference(weight, x)
    approx, bound = at_threads(1, lambda: head.bounds(x))
    np.testing.assert_allclose(approx.double().numpy(), want_approx, rtol=1e-5, atol=1e-5 * np.abs(want_approx).max())
    np.testing.assert_allclose(bound.double().numpy(), want_bound * (1 + argmax_head.BOUND_MARGIN), rtol=1e-5)
    assert ((weight.matmul(x) - approx).abs() <= bound).all()
    for kernel in quant.kernels():  # the grouped pass whatever the product kernel, on either thread count
        with quant.use_kernel(kernel):
            again = at_threads(2, lambda: head.bounds(x))
        assert torch.equal(again[0], approx) and torch.equal(again[1], bound), kernel
    for i in range(inputs):  # each input's bits alone as among the others (passes of 8 and the rest)
        alone = head.bounds(x[i:i + 1])
        assert torch.equal(alone[0][0], approx[i]) and torch.equal(alone[1][0], bound[i]), i


def test_the_grouped_bound_is_needed_whole_a_tenth_of_it_is_broken():
    weight = quant.random_quant_matrix("Q6_K", 320, 1536, seed=3)
    x = torch.randn(3, 1536, generator=torch.Generator().manual_seed(1))
    head = ArgmaxHead(weight)
    approx, bound = head.bounds(x)
    assert head.grouped and not ((weight.matmul(x) - approx).abs() <= bound / 10).all()


def test_verify_passes_run_the_grouped_argmax_head_with_the_full_heads_argmax(files):
    full, fast = sessions(files["target"])
    assert fast.argmax_head.grouped
    prompt = [3, 17, 99, 250, 1000, 42, 7, 8]
    for session in (full, fast):
        session.extend(prompt, 1)
    fast.set_argmax_only(True)
    for tokens in ([5, 6, 9, 11], list(range(20, 20 + argmax_head.GROUPED_MAX_ROWS))):
        before = len(fast.argmax_head.candidates)
        want, got = full.extend(tokens, len(tokens)), fast.extend(tokens, len(tokens))
        assert torch.equal(got.argmax(dim=1), want.argmax(dim=1))
        kept = torch.isfinite(got)
        assert torch.equal(got[kept], want[kept]) and not kept.all()  # candidates exact, the rest -inf
        assert len(fast.argmax_head.candidates) == before + len(tokens)  # the argmax head ran, one count a row
        for session in (full, fast):
            session.crop(len(prompt))
    many = list(range(40, 41 + argmax_head.GROUPED_MAX_ROWS))  # more logits than it takes: the full head
    before = len(fast.argmax_head.candidates)
    assert torch.equal(fast.extend(many, len(many)), full.extend(many, len(many)))
    assert len(fast.argmax_head.candidates) == before


def test_the_grouped_first_pass_refuses_what_it_cannot_run():
    head = ArgmaxHead(quant.random_quant_matrix("Q6_K", 64, 256))
    x, y = torch.randn(1, 256), torch.empty(1, 64)
    run = lambda n, k, kernel="avx2": quant._quant.hi4_r16_matmul(  # noqa: E731
        head.hi4_groups.data_ptr(), x.data_ptr(), y.data_ptr(), y.data_ptr(), n, k, 1, 1, kernel)
    with pytest.raises(ValueError, match="multiple of 16"):
        run(60, 256)
    with pytest.raises(ValueError, match="multiple of 16"):
        quant._quant.hi4_r16_pack(head.rows.raw.data_ptr(), head.hi4_groups.data_ptr(), 60, 256)
    with pytest.raises(ValueError, match="multiple of 256"):
        run(64, 100)
    with pytest.raises(ValueError, match="unknown product kernel avx3"):
        run(64, 256, "avx3")
    for kernel in {"avx512-vnni", "amx"} - set(quant.kernels()):  # a kernel this CPU cannot run is refused
        with pytest.raises(ValueError, match=f"cannot run the {kernel} product kernel"):
            run(64, 256, kernel)
    ragged = ArgmaxHead(quant.random_quant_matrix("Q6_K", 40, 256))  # rows not in whole groups: the rows' pass
    assert not ragged.grouped and ragged.max_rows == 1 and ragged.hi4_groups is None
