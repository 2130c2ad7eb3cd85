"""Chat templates: how a prompt is put in front of a model, the same way for SFT and sampling.

The prompt becomes a user message followed by the assistant's generation prompt
(`apply_chat_template(..., add_generation_prompt=True)`) when the caller asks for it and the
tokenizer has a template; the tiny character tokenizer has none, so its prompts stay as they are.
"""

from __future__ import annotations


def format_prompt(tokenizer, prompt: str, chat_template: bool) -> str:
    """The prompt as the model sees it: a user turn plus the assistant's generation prompt when
    `chat_template` is on and the tokenizer has a template; otherwise unchanged."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": prompt}]
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return prompt
