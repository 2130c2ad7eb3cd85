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

from collections.abc import Callable, Sequence
from typing import Any


def prompt_formatter(
    tokenizer,
    chat_template: bool,
    system: str | None = None,
    examples: Sequence[tuple[str, str]] = (),
) -> Callable[[str], str]:
    """The function that puts a prompt in front of this model, decided once: a user turn
    (after `system`, when given, and after `examples` as earlier user/assistant turns: a
    few-shot prompt) plus the assistant's generation prompt when `chat_template` is on and the
    tokenizer has a template (its leading BOS dropped when the tokenizer adds one anyway);
    otherwise the identity."""
    if not has_chat_template(tokenizer, chat_template):
        return _unchanged
    strip = tokenizer.bos_token if adds_bos(tokenizer) else None
    head = [{"role": "system", "content": system}] if system else []
    for question, answer in examples:
        head += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]

    def formatted(prompt: str) -> str:
        messages = [*head, {"role": "user", "content": prompt}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return text[len(strip) :] if strip and text.startswith(strip) else text

    return formatted


def has_chat_template(tokenizer, chat_template: bool = True) -> bool:
    """Whether prompts go through a template: asked for, and the tokenizer has one."""
    return bool(chat_template and getattr(tokenizer, "chat_template", None))


def format_prompt(tokenizer, prompt: str, chat_template: bool, system: str | None = None) -> str:
    """The prompt as the model sees it (`prompt_formatter`, for one prompt)."""
    return prompt_formatter(tokenizer, chat_template, system)(prompt)


def format_rows(
    tokenizer,
    rows: Any,
    chat_template: bool,
    system: str | None = None,
    examples: Sequence[tuple[str, str]] = (),
) -> Any:
    """`rows` (a list or an iterator of task rows) with each `prompt` as the model sees it; the
    other columns unchanged. A list stays a list, a stream a stream; without a template the
    rows are returned as they are."""
    fmt = prompt_formatter(tokenizer, chat_template, system, examples)
    if fmt is _unchanged:
        return rows
    formatted = ({**row, "prompt": fmt(row["prompt"])} for row in rows)
    return list(formatted) if isinstance(rows, list) else formatted


def adds_bos(tokenizer) -> bool:
    """Whether tokenizing text adds the BOS token in front (Llama-style post-processors do)."""
    if tokenizer.bos_token_id is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def _unchanged(prompt: str) -> str:
    return prompt
