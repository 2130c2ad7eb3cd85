"""Where rollouts come from: one small interface, the in-process engine, and vLLM's.

The training loop only ever calls `engine.generate(...)` before a step and
`engine.load_weights(state_dict)` after an update: weights cross as a state dict. Anything
that can do those two things can serve rollouts: the in-process Hugging Face/torch sampler
(the default, `HFEngine`), vLLM on a GPU (`VLLMEngine`), or later a proxy to workers in other
processes or machines. Prompts go in as strings and a `RolloutBatch` of plain tensors comes
back (built by `rollout_batch`), so a remote engine only has to ship token ids and log-probs.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import torch

from rlvr.rollout.sampler import RolloutBatch, rollout_batch, sample_completions


class RolloutEngine(Protocol):
    """What the loop needs from a rollout engine."""

    def generate(
        self,
        prompts: list[str],
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        """`num_samples` completions per prompt, group-major, with sampling log-probs."""
        ...

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Make the next `generate` sample from these weights (the policy's state dict)."""
        ...


class HFEngine:
    """Samples with the policy module itself (KV cache, finished rows dropped, prompt cache
    shared across the group): nothing to sync, the weights are the policy's. `workers` > 1
    samples shards of the prompts in that many threads (`rlvr.workers`)."""

    def __init__(self, model: torch.nn.Module, tokenizer, workers: int = 1) -> None:
        self.model, self.tokenizer, self.workers = model, tokenizer, workers

    def generate(
        self,
        prompts: list[str],
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        return sample_completions(
            self.model,
            self.tokenizer,
            prompts,
            num_samples,
            max_new_tokens,
            temperature,
            generator,
            workers=self.workers,
        )

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy the weights in, unless they are this model's own tensors (the engine samples
        with the policy module itself: nothing to do)."""
        own = self.model.state_dict()
        if all(own[k].data_ptr() == v.data_ptr() for k, v in state_dict.items() if k in own):
            return
        self.model.load_state_dict(state_dict)


def vllm_available() -> bool:
    """True when vLLM imports and a CUDA device is present (vLLM has no CPU path we use)."""
    if not torch.cuda.is_available():
        return False
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


class VLLMEngine:
    """Rollouts from vLLM in this process, sharing the GPU with the trainer ("colocate").

    Log-probs are requested after temperature scaling (`logprobs_mode="processed_logprobs"`),
    the distribution the loss compares against. `load_weights` loads the policy's state dict
    into vLLM's model after every update. vLLM's RNG is its own: runs are seeded through
    `seed`, not through the loop's generator. Needs vLLM and a GPU; untested on the CPU-only
    machines this project is developed on (its test skips there).
    """

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer,
        gpu_memory_utilization: float = 0.3,
        seed: int = 0,
        dtype: str = "auto",
    ) -> None:
        if not vllm_available():
            raise RuntimeError(
                "VLLMEngine needs vLLM and a CUDA GPU (pip install vllm on a GPU machine); "
                "use the default in-process engine otherwise"
            )
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # model in this process
        from vllm import LLM

        self.tokenizer = tokenizer
        self.llm = LLM(
            model=str(model_dir),
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=True,  # the G samples of a prompt share its KV blocks
            seed=seed,
            dtype=dtype,
            logprobs_mode="processed_logprobs",
        )

    def generate(
        self,
        prompts: list[str],
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        from vllm import SamplingParams

        greedy = temperature == 0
        params = SamplingParams(
            n=num_samples,
            temperature=temperature,
            max_tokens=max_new_tokens,
            logprobs=0,  # the sampled token's log-prob only
            stop_token_ids=[self.tokenizer.eos_token_id],
            skip_special_tokens=False,
        )
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        rows, logps = [], []
        for output in outputs:
            for sample in output.outputs:
                ids = list(sample.token_ids)
                rows.append(ids)
                logps.append(
                    [
                        0.0 if greedy else step[tok].logprob
                        for tok, step in zip(ids, sample.logprobs)
                    ]
                )
        return batch_from_token_lists(self.tokenizer, prompts, num_samples, rows, logps)

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        executor = self.llm.llm_engine.model_executor
        worker = executor.driver_worker
        runner = getattr(worker, "worker", worker).model_runner  # vLLM V1 wraps the worker
        runner.model.load_weights(state_dict.items())
        self.llm.reset_prefix_cache()  # cached prompt blocks hold the old weights' keys


def batch_from_token_lists(
    tokenizer,
    prompts: list[str],
    num_samples: int,
    completion_tokens: list[list[int]],
    completion_logprobs: list[list[float]],
) -> RolloutBatch:
    """A RolloutBatch from per-row token and log-prob lists (any engine's raw output)."""
    encoded = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left")
    width = max(1, max(len(t) for t in completion_tokens))
    n = len(completion_tokens)
    ids = torch.full((n, width), tokenizer.pad_token_id, dtype=torch.long)
    logps = torch.zeros((n, width))
    for i, (tokens, values) in enumerate(zip(completion_tokens, completion_logprobs)):
        ids[i, : len(tokens)] = torch.tensor(tokens, dtype=torch.long)
        logps[i, : len(values)] = torch.tensor(values, dtype=torch.float)
    return rollout_batch(
        tokenizer,
        encoded["input_ids"].repeat_interleave(num_samples, dim=0),
        encoded["attention_mask"].repeat_interleave(num_samples, dim=0),
        ids,
        logps,
        num_samples,
        num_generated=torch.tensor([len(t) for t in completion_tokens]),
    )
