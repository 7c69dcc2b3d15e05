"""An exact greedy LM head that reads 30% fewer bytes: a bounded 4-bit first pass, then the Q6_K rows that can win.

At temperature 0 a decoder needs only the argmax of the target's logits. A Q6_K head (the 1.5B target's: 191 MB, a
sixth of a step's bytes) holds 6-bit quants q = 4 hi + lo; its top four bits alone (Q6_K_HI4, 146 bytes a block
against 210) give every logit to within a bound computed in the same pass (specdec/native/_quant_hi4.h). A row whose
approximate logit plus its bound falls below the best lower bound (approximate minus bound) cannot be the argmax;
the rows left, the candidates (the median over 192 positions of the study's prompts: 140 of 151936), are computed
by the Q6_K product itself, whose rows are the same bits whichever rows share a call. So the argmax of what
`ArgmaxHead.logits` returns (the candidates' exact logits, -inf elsewhere) is the full head's, ties included (every
row tied at the maximum is a candidate, and argmax takes the first). Where more than `FULL_HEAD_SHARE` of the rows
are candidates (a flat distribution) the whole Q6_K head runs instead.

Where the head's rows come in whole groups of 16 the first pass runs over the top bits in groups of 16 rows
(hi4_r16_pack, hi4_r16_matmul; with AVX512-VNNI on 512-bit registers, on AVX2 alone on 256-bit ones: the same
bits): the same integers with about 40% fewer multiplies, so a verify pass of up to GROUPED_MAX_ROWS logits runs it
too (the 1.5B head, first pass alone: AMD EPYC Zen 4 4.6 against 7.9 ms for the Q6_K verify head at 5 rows, 4.1
against 5.1 ms for the first pass in rows at 1 row; Zen 3 (AVX2) 10.2 against 16.4 ms, and 6.2 against 7.0; since the
Q6_K rows take six inputs a pass there, the Zen 3's first pass at 5 and 7 rows runs 1.20x and 1.12x their rate,
experiments/cpu-lead, twenty-fourth run).
Every pass then runs the grouped one, so a position's candidates are the same whether a step or a verify pass
computes it.

Only for greedy decoding: the other logits are not there, so only the decoding loops at temperature 0 turn it on
(decode.argmax_only, LeanLM.set_argmax_only); sampling keeps every logit."""

from __future__ import annotations

import torch

from specdec.gguf import quant
from specdec.gguf.quant import QuantMatrix, available

HI4_BLOCK_BYTES = 146  # specdec/native/_quant_hi4.h
# The bound is widened by this share of itself for float rounding (_quant_hi4.h: the rounding can move either sum by
# about 2^-16 of it at most).
BOUND_MARGIN = 2.0 ** -10
# Above this share of candidate rows the Q6_K head runs whole: that many rows read one by one cost about as much.
FULL_HEAD_SHARE = 0.25
# Passes of up to this many logits run the grouped first pass (a verify pass of k up to 15); the rows' first pass is
# compute-bound from 2 rows on, so without the groups only one-logit passes run the argmax head.
GROUPED_MAX_ROWS = 16


class ArgmaxHead:
    """The exact greedy form of a Q6_K LM head (module docstring). head: the session's head (a Q6_K QuantMatrix in
    either layout, the whole vocabulary); kept for the candidates' exact logits, its top bits copied once (70% of its
    bytes again, in groups of 16 rows where the first pass runs grouped; where the head loads in groups of 16 rows,
    its file's rows too, for the candidates' rows)."""

    def __init__(self, head: QuantMatrix):
        if not isinstance(head, QuantMatrix) or head.qtype != "Q6_K":
            raise ValueError(f"the exact argmax head runs on a Q6_K LM head, got "
                             f"{getattr(head, 'qtype', type(head).__name__)}")
        if not available():
            raise RuntimeError("the exact argmax head needs specdec.native._quant on an x86 CPU with AVX2")
        self.head = head
        self.rows = head.in_layout("rows")  # the candidates are gathered from the file's rows
        self.out_features, self.in_features = head.shape
        self.grouped = self.out_features % quant.R16_ROWS == 0
        self.hi4_groups = None  # the top bits in groups of 16 rows, where the first pass runs grouped
        self._hi4 = None  # in the file's rows, made on first use
        if self.grouped:
            self.hi4_groups = self._top_bits()
            quant._quant.hi4_r16_pack(self.rows.raw.data_ptr(), self.hi4_groups.data_ptr(), self.out_features,
                                      self.in_features)
        self.last_candidates: list[int] = []  # per row of the last call: how many rows the Q6_K product computed
        self.candidates: list[int] = []  # every call's rows, each row's count (for a bench's distribution)
        self.full_head_calls = 0  # calls that ran the whole Q6_K head (too many candidates)
        self._scratch: dict[int, tuple[torch.Tensor, ...]] = {}  # _buffers

    def _top_bits(self) -> torch.Tensor:
        return quant.weight_bytes(self.out_features, self.in_features // 256 * HI4_BLOCK_BYTES)

    @property
    def hi4(self) -> torch.Tensor:
        """The top bits in the file's rows (Q6_K_HI4 rows: what the first pass reads where it does not run grouped),
        packed on first use."""
        if self._hi4 is None:
            self._hi4 = self._top_bits()
            quant._quant.hi4_pack(self.rows.raw.data_ptr(), self._hi4.data_ptr(), self.out_features,
                                  self.in_features)
        return self._hi4

    @property
    def max_rows(self) -> int:
        """The most logits a pass may ask of this head (LeanLM runs it for passes up to this many)."""
        return GROUPED_MAX_ROWS if self.grouped else 1

    @property
    def nbytes(self) -> int:
        """Bytes the first pass reads (the candidates' rows come on top, a few hundred KB at the median)."""
        return self.out_features * (self.in_features // 256) * HI4_BLOCK_BYTES

    def _buffers(self, rows: int) -> tuple[torch.Tensor, ...]:
        """(approx, bound, index, member, counts) for passes of `rows` inputs, made once: fresh megabytes on every
        step would each cost their page faults."""
        if rows not in self._scratch:
            self._scratch[rows] = (torch.empty(rows, self.out_features), torch.empty(rows, self.out_features),
                                   torch.empty(self.out_features, dtype=torch.int64),
                                   torch.empty(rows, self.out_features, dtype=torch.uint8),
                                   torch.empty(rows, dtype=torch.int64))
        return self._scratch[rows]

    def _first_pass(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        quant.check_quant_product(x, self.head, None)
        x = x.float().contiguous()
        approx, bound = self._buffers(x.shape[0])[:2]
        if self.grouped:  # whatever product kernel is chosen: every pass the same first pass, the same candidates
            quant._quant.hi4_r16_matmul(self.hi4_groups.data_ptr(), x.data_ptr(), approx.data_ptr(),
                                        bound.data_ptr(), self.out_features, self.in_features, x.shape[0],
                                        torch.get_num_threads(), quant.kernel_name())
        else:
            quant._quant.hi4_matmul(self.hi4.data_ptr(), x.data_ptr(), approx.data_ptr(), bound.data_ptr(),
                                    self.out_features, self.in_features, x.shape[0], torch.get_num_threads(),
                                    quant.kernel_name())
        return x, approx, bound

    def bounds(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(approximate logits, their bounds, the margin included), each (rows, out_features), of x (rows,
        in_features): the Q6_K head's logit of every row lies within bound of the approximate one."""
        _, approx, bound = self._first_pass(x)
        return approx.clone(), bound.mul(1.0 + BOUND_MARGIN)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(rows, out_features): the Q6_K head's logits where a row can be its argmax, -inf elsewhere (module
        docstring): its argmax is the full head's, bit for bit in value."""
        x, approx, bound = self._first_pass(x)
        rows = x.shape[0]
        _, _, index, member, counts = self._buffers(rows)
        kept = quant._quant.hi4_candidates(approx.data_ptr(), bound.data_ptr(), self.out_features, rows,
                                           BOUND_MARGIN, index.data_ptr(), member.data_ptr(), counts.data_ptr())
        self.last_candidates = counts.tolist()
        self.candidates += self.last_candidates
        # no candidate at all would take a NaN logit (no comparison holds): the full head then says what it says
        if kept == 0 or max(self.last_candidates) > FULL_HEAD_SHARE * self.out_features:
            self.full_head_calls += 1
            return self.head.matmul(x)
        out = torch.empty(rows, self.out_features)
        quant._quant.hi4_exact_rows(self.rows.raw.data_ptr(), self.rows.raw.shape[1], index.data_ptr(),
                                    member.data_ptr(), kept, x.data_ptr(), out.data_ptr(), self.out_features,
                                    self.in_features, rows, torch.get_num_threads(), quant.kernel_name())
        return out
