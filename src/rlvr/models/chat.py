"""Chat templates: how a prompt is put in front of a model, the same way for RL rollouts,
evaluation, rejection sampling and SFT.

The prompt becomes a user message (after an optional system message) followed by the
assistant's generation prompt (`apply_chat_template(..., add_generation_prompt=True)`) when
the caller asks for it and the tokenizer has a template; the tiny character tokenizer has none,
so its prompts stay as they are. Every consumer then tokenizes the text with the tokenizer's
special tokens, so a template that writes its own BOS (Llama 3's does) has it removed here when
the tokenizer adds one anyway: the model sees exactly one.
"""

from __future__ import annotations

from typing import Any


def format_prompt(tokenizer, prompt: str, chat_template: bool, system: str | None = None) -> str:
    """The prompt as the model sees it: a user turn (after `system`, when given) plus the
    assistant's generation prompt when `chat_template` is on and the tokenizer has a template;
    otherwise unchanged."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": prompt})
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return _without_doubled_bos(tokenizer, text)
    return prompt


def format_rows(tokenizer, rows: Any, chat_template: bool, system: str | None = None) -> Any:
    """`rows` (a list or an iterator of task rows) with each `prompt` as the model sees it
    (`format_prompt`); the other columns unchanged. A list stays a list, a stream a stream."""
    if not (chat_template and getattr(tokenizer, "chat_template", None)):
        return rows
    formatted = (
        {**row, "prompt": format_prompt(tokenizer, row["prompt"], chat_template, system)}
        for row in rows
    )
    return list(formatted) if isinstance(rows, list) else formatted


def adds_bos(tokenizer) -> bool:
    """Whether tokenizing text adds the BOS token in front (Llama-style post-processors do)."""
    if tokenizer.bos_token_id is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def _without_doubled_bos(tokenizer, text: str) -> str:
    """`text` without its leading BOS when the tokenizer will add one itself."""
    bos = tokenizer.bos_token
    if bos and text.startswith(bos) and adds_bos(tokenizer):
        return text[len(bos) :]
    return text
