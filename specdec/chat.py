"""A prompt as a chat: the text as one user turn through the tokenizer's chat template, then token ids."""

from __future__ import annotations

from typing import Sequence


def apply_chat_template(texts: Sequence[str], tokenizer, use_chat_template: bool = True,
                        system_prompt: str | None = None) -> list[str]:
    """Each text as a one-turn user conversation through the tokenizer's chat template, generation prompt added.

    With `use_chat_template=False` the texts come back unchanged (base models)."""
    if not use_chat_template:
        return list(texts)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("the tokenizer has no chat_template; set prompts.use_chat_template: false for a base model")
    out = []
    for text in texts:
        messages = ([{"role": "system", "content": system_prompt}] if system_prompt else []) + \
                   [{"role": "user", "content": text}]
        out.append(tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True))
    return out


def tokenize_prompts(chat_texts: Sequence[str], tokenizer, use_chat_template: bool = True) -> list[list[int]]:
    """Token ids per text; special tokens are added only without a chat template (the template already writes them)."""
    return [list(map(int, tokenizer(t, add_special_tokens=not use_chat_template)["input_ids"])) for t in chat_texts]
