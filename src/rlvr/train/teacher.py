"""The teacher of on-policy distillation: a frozen model that scores the student's own samples.

`load_teacher` loads it once (eval mode, no gradients, the student's device and dtype) and
refuses a tokenizer other than the student's: the advantage `log q - log pi` compares the two
models' log-probs of the same token ids. `Teacher.logprobs` is its forward on rollouts, as the
learner's reference forward is (`completion_logprobs` at the sampling temperature, under
no_grad); the learner holds the teacher and runs it (`Learner.teacher_logprobs`, each rank on
its own rows); `distill_metrics` is the step's `distill/*` line.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from rlvr import algo
from rlvr.config import ConfigError
from rlvr.models.logprobs import completion_logprobs
from rlvr.models.tiny import ModelDirectoryError, load_model
from rlvr.rollout.sampler import RolloutBatch


class TeacherError(ConfigError):
    """A teacher directory that cannot teach this student (missing, or another tokenizer)."""


@dataclass
class Teacher:
    """A frozen model and how to score with it: the run's sampling temperature and log-prob
    chunk size (the reference's settings)."""

    model: torch.nn.Module
    temperature: float
    chunk_tokens: int = 0

    @torch.no_grad()
    def logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """[N, T] the teacher's log-probs of the batch's sampled tokens at the sampling
        temperature (padding positions hold meaningless values)."""
        return completion_logprobs(
            self.model, *batch.model_inputs(), self.temperature, chunk_tokens=self.chunk_tokens
        )


def load_teacher(
    directory: str | Path,
    student_tokenizer,
    device: torch.device | str,
    dtype: torch.dtype,
    temperature: float,
    chunk_tokens: int = 0,
) -> Teacher:
    """The model in `directory` as a frozen `Teacher` on `device` in `dtype`.

    Raises `TeacherError` (one line naming the directory) when it is not a complete model
    directory or its tokenizer differs from `student_tokenizer` (`tokenizer_difference`)."""
    try:
        model, tokenizer = load_model(directory, dtype=dtype, device=device)
    except ModelDirectoryError as exc:
        raise TeacherError(f"teacher: {exc}") from exc
    difference = tokenizer_difference(tokenizer, student_tokenizer)
    if difference:
        raise TeacherError(
            f"teacher {directory}: its tokenizer is not the student's ({difference}); "
            "distillation compares the two models' log-probs token by token, so give a teacher "
            "trained with the student's tokenizer"
        )
    model.eval()
    model.requires_grad_(False)
    return Teacher(model, temperature, chunk_tokens)


def tokenizer_difference(teacher, student) -> str:
    """The first way `teacher`'s tokenizer differs from `student`'s as a short phrase (the
    vocabulary's size, a token's id, a special token), or "" when they map every token alike."""
    teacher_vocab, student_vocab = teacher.get_vocab(), student.get_vocab()
    if len(teacher_vocab) != len(student_vocab):
        return f"{len(teacher_vocab)} tokens against {len(student_vocab)}"
    for token, index in sorted(student_vocab.items(), key=lambda item: item[1]):
        if teacher_vocab.get(token) != index:
            return f"token {token!r} is id {teacher_vocab.get(token)} against {index}"
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if getattr(teacher, name, None) != getattr(student, name, None):
            return f"{name} {getattr(teacher, name, None)} against {getattr(student, name, None)}"
    return ""


def distill_metrics(
    batch: RolloutBatch, teacher_logp: torch.Tensor | None, loss_mask: torch.Tensor
) -> dict[str, float]:
    """`distill/reverse_kl`: the sampled reverse KL `log pi - log q` averaged over the loss
    mask's tokens of the batch (divided by their count; the student's log-probs those it
    sampled with); nothing without a teacher."""
    if teacher_logp is None:
        return {}
    kl = -algo.reverse_kl_advantages(batch.logprobs, teacher_logp, loss_mask)
    return {"distill/reverse_kl": algo.masked_mean(kl, loss_mask).item()}
