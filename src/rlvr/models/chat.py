"""Chat templates: how a prompt is put in front of a model, the same way for RL rollouts,
evaluation, rejection sampling and SFT.

The prompt becomes a user message (after an optional system message) followed by the
assistant's generation prompt (`apply_chat_template(..., add_generation_prompt=True)`) when
the caller asks for it and the tokenizer has a template; the tiny character tokenizer has none,
so its prompts stay as they are. A row that carries its own chat `messages` (a dataset file in
verl's or TRL's conversational layout, `rlvr.tasks.dataset_files`) goes through the template as
those messages; its `prompt` is their contents joined, which is what a model without a template
sees. Every consumer then tokenizes the text with the tokenizer's
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
    render = _renderer(tokenizer, chat_template, system, examples)
    if render is None:
        return _unchanged

    def formatted(prompt: str) -> str:
        return render([{"role": "user", "content": prompt}])

    return formatted


def row_formatter(
    tokenizer,
    chat_template: bool,
    system: str | None = None,
    examples: Sequence[tuple[str, str]] = (),
) -> Callable[[dict[str, Any]], str]:
    """The function from a task row to its prompt as this model sees it, decided once.

    A row with chat `messages` (a list of {"role", "content"} dicts) goes through the template
    as those messages: `system` only when they have no system message of their own, `examples`
    after their leading system messages and before the rest (their user turn). A row without
    them is `prompt_formatter`'s user turn of `row["prompt"]`. Without a template (or with
    `chat_template` off) it returns `row["prompt"]` as it is.
    """
    render = _renderer(tokenizer, chat_template, system, examples)
    if render is None:
        return _row_prompt

    def formatted(row: dict[str, Any]) -> str:
        messages = row.get("messages")
        if not messages:
            return render([{"role": "user", "content": row["prompt"]}])
        return render(list(messages))

    return formatted


def _renderer(
    tokenizer,
    chat_template: bool,
    system: str | None,
    examples: Sequence[tuple[str, str]],
) -> Callable[[list[dict[str, Any]]], str] | None:
    """messages -> the templated text with the generation prompt, `system` and `examples`
    placed as `row_formatter` says; None when prompts go through no template."""
    if not has_chat_template(tokenizer, chat_template):
        return None
    strip = tokenizer.bos_token if adds_bos(tokenizer) else None
    shots: list[dict[str, Any]] = []
    for question, answer in examples:
        shots += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]

    def render(messages: list[dict[str, Any]]) -> str:
        lead = 0
        while lead < len(messages) and messages[lead].get("role") == "system":
            lead += 1
        has_system = any(m.get("role") == "system" for m in messages)
        head = [{"role": "system", "content": system}] if system and not has_system else []
        turns = [*head, *messages[:lead], *shots, *messages[lead:]]
        text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
        return text[len(strip) :] if strip and text.startswith(strip) else text

    return render


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
    """`rows` (a list or an iterator of task rows) with each `prompt` as the model sees it
    (`row_formatter`: a row's own chat `messages` when it has them); the other columns
    unchanged. A list stays a list, a stream a stream; without a template the rows are returned
    as they are."""
    fmt = row_formatter(tokenizer, chat_template, system, examples)
    if fmt is _row_prompt:
        return rows
    formatted = ({**row, "prompt": fmt(row)} for row in rows)
    return list(formatted) if isinstance(rows, list) else formatted


def adds_bos(tokenizer) -> bool:
    """Whether tokenizing text adds the BOS token in front (Llama-style post-processors do)."""
    if tokenizer.bos_token_id is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0] == tokenizer.bos_token_id


def _unchanged(prompt: str) -> str:
    return prompt


def _row_prompt(row: dict[str, Any]) -> str:
    return row["prompt"]
