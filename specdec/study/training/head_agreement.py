"""Feature heads' greedy drafts checked offline, by draft position: the target's greedy answers to the evaluation
prompts with its features at every position, and each head drafting k tokens from every position of the answers
(feature_head.greedy_blocks). No decoding loop and no timing: what greedy decoding would accept, block by block
(here blocks start at every position; decoding starts one after each miss), in seconds a head."""

from __future__ import annotations

import time
from typing import Callable, Iterable, Sequence

import pandas as pd
import torch

from specdec.drafts.feature_head import FeatureHead
from specdec.study.training.feature_head import greedy_blocks, layer_columns, self_distilled

COLUMNS = ["head", "domain", "prompts", "blocks", "position", "reached", "accepted", "rate", "tokens_per_pass"]


def greedy_answers(session, prompts: pd.DataFrame, new_tokens: int, log: Callable[[str], None] = print,
                   layers: Sequence[int] = ()) -> list[tuple[str, list[int], int, torch.Tensor]]:
    """(domain, prompt + the target's greedy answer, prompt length, the target's features at every position, with the
    outputs of `layers` beside them) of each prompt (columns domain, prompt_id, input_ids), from a session that keeps
    its features (feature_head.self_distilled: the answer's last token dropped, the features rounded to fp16 as in the
    heads' training data)."""
    out = []
    for i, row in enumerate(prompts.itertuples(index=False)):
        start = time.perf_counter()
        ids, features = self_distilled(session, row.input_ids, new_tokens, layers)
        out.append((row.domain, ids, len(row.input_ids), features.float()))
        log(f"[{i + 1}/{len(prompts)}] {row.prompt_id}: {len(ids) - len(row.input_ids)} tokens "
            f"({time.perf_counter() - start:.1f}s)")
    return out


def agreement_rows(name: str, domain: str, blocks: Sequence[torch.Tensor]) -> list[dict]:
    """Rows of the table for one head and domain from greedy_blocks' blocks of its sequences (each (n, k)): per draft
    position j, the blocks whose first j - 1 drafts were the target's tokens (reached), those whose first j were
    (accepted), their ratio, and the tokens a verify pass would emit at k = j (1 + accepted drafts per block)."""
    leading = torch.cat([b.int().cumprod(1) for b in blocks])
    n, k = leading.shape
    accepted = leading.sum(0).tolist()
    rows, reached = [], n
    for j in range(k):
        rows.append({"head": name, "domain": domain, "prompts": len(blocks), "blocks": n, "position": j + 1,
                     "reached": reached, "accepted": accepted[j], "rate": accepted[j] / reached if reached else None,
                     "tokens_per_pass": 1 + sum(accepted[:j + 1]) / n})
        reached = accepted[j]
    return rows


def agreement_table(parts, heads: dict[str, FeatureHead], answers: Iterable, k: int, layers: Sequence[int] = ()
                    ) -> pd.DataFrame:
    """The table (COLUMNS) of each head on greedy_answers' sequences, blocks starting inside the answers (the first
    draft of a block after the prompt's pass is the answer's second token, as in decoding). parts: the target's
    (drafts.feature_head.target_parts); layers: those greedy_answers kept (each head reads the ones it fuses)."""
    answers, rows = list(answers), []
    for name, head in heads.items():
        head = head.float()
        head_rows = parts.head_rows(head.draft_vocab)  # once a head, not once a sequence (GGUF: dequantised rows)
        by_domain: dict[str, list[torch.Tensor]] = {}
        for domain, ids, n_prompt, features in answers:
            rows_read = layer_columns(features, layers, head.config.fused_layers, head.config.hidden_size)
            blocks = greedy_blocks(head, parts, rows_read, torch.tensor(ids), k, head_rows)
            by_domain.setdefault(domain, []).append(blocks[n_prompt - 1:])
        for domain, blocks in by_domain.items():
            rows += agreement_rows(name, domain, blocks)
    return pd.DataFrame(rows, columns=COLUMNS)
