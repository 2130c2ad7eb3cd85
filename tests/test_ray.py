"""RayEngine: rollout actors on a local Ray bound to 127.0.0.1 (one cluster for the file)."""

import copy
import dataclasses
import os
import re
import signal
import socket
import threading
import time

import pytest
import torch

ray = pytest.importorskip("ray")

from rlvr.models.tiny import TinyModelConfig, build_char_tokenizer, build_tiny_model  # noqa: E402
from rlvr.rollout.engine import HFEngine  # noqa: E402
from rlvr.rollout.ray_cluster import RayEngineError, start_ray  # noqa: E402
from rlvr.rollout.ray_engine import RayEngine, contiguous_chunks  # noqa: E402
from rlvr.rollout.weight_transport import (  # noqa: E402
    broadcast_tensors,
    listening_socket,
    pack_state_dict,
    receive_tensors,
    tensor_specs,
    unpack_state_dict,
    weight_group,
)
from rlvr.workers import WorkerError  # noqa: E402

TOKENIZER = build_char_tokenizer()
SHAPE = TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)
PROMPTS = ["12+34=", "5+6=", "777+8=", "1+1=", "90+10="]  # 5: chunks of 2 and 3


def tiny_model(seed: int) -> torch.nn.Module:
    """A tiny model whose greedy continuations differ from prompt to prompt (weights drawn
    with std 0.5; at the default init every prompt continues "=====") and some of whose rows
    end early (the EOS embedding scaled up), so chunks merge rows of uneven lengths."""
    model = build_tiny_model(SHAPE, TOKENIZER, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5, generator=generator)
        model.get_input_embeddings().weight[TOKENIZER.eos_token_id] *= 3.0
    return model


def assert_same_batch(actual, expected) -> None:
    for name in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask", "truncated"):
        assert torch.equal(getattr(actual, name), getattr(expected, name)), name
    assert actual.group_ids.tolist() == expected.group_ids.tolist()
    assert actual.row_index.tolist() == expected.row_index.tolist()
    assert actual.completions == expected.completions
    torch.testing.assert_close(actual.logprobs, expected.logprobs, atol=1e-5, rtol=0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- no cluster needed --------------------------------------------------------------------


def test_an_address_nothing_answers_at_is_one_line_not_minutes_of_retries():
    assert not ray.is_initialized()  # runs before the cluster fixture starts one
    address = f"127.0.0.1:{free_port()}"
    start = time.monotonic()
    with pytest.raises(RayEngineError, match=re.escape(f"--ray-address {address}: no Ray")):
        start_ray(address)
    assert time.monotonic() - start < 10 and not ray.is_initialized()


def test_chunks_are_contiguous_balanced_and_never_empty():
    assert contiguous_chunks(5, 2) == [(0, 2), (2, 5)]
    assert contiguous_chunks(2, 4) == [(0, 1), (1, 2)]
    for n, k in [(7, 3), (8, 4), (1, 1), (9, 2)]:
        chunks = contiguous_chunks(n, k)
        assert [i for a, b in chunks for i in range(a, b)] == list(range(n))
        sizes = [b - a for a, b in chunks]
        assert min(sizes) >= 1 and max(sizes) - min(sizes) <= 1


def test_packed_weights_keep_bf16_bits_and_ship_tied_tensors_once():
    torch.manual_seed(0)
    embed = torch.randn(4, 3)
    state_dict = {
        "embed": embed,
        "head": embed,  # tied
        "half": torch.randn(2, 5).to(torch.bfloat16),
        "steps": torch.arange(3),
        "strided": torch.randn(3, 4).t(),
    }
    packed = pack_state_dict(state_dict)
    assert set(packed.arrays) == {"embed", "half", "steps", "strided"}
    assert packed.aliases == {"head": "embed"} and packed.dtypes == {"half": "bfloat16"}
    restored = unpack_state_dict(packed)
    assert restored.keys() == state_dict.keys()
    for name, tensor in state_dict.items():
        assert restored[name].dtype == tensor.dtype and torch.equal(restored[name], tensor), name


def test_the_collective_weight_path_broadcasts_every_tensor_over_gloo():
    """The "nccl" transport's group and broadcast, run over gloo by two threads on loopback
    (the NCCL group itself needs GPUs)."""
    torch.manual_seed(0)
    sent = {"a": torch.randn(3, 2), "b": torch.arange(5), "c": torch.randn(4).to(torch.bfloat16)}
    listener, received = listening_socket("127.0.0.1"), {}
    port = listener.getsockname()[1]

    def rank(r: int) -> None:
        group = weight_group(
            "gloo", "127.0.0.1", port, r, 2, timeout_s=20, listener=listener if r == 0 else None
        )
        if r == 0:
            broadcast_tensors(group, list(sent.values()), timeout_s=20)
        else:
            received.update(receive_tensors(group, tensor_specs(sent), "cpu", timeout_s=20))

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert received.keys() == sent.keys()
    for name, tensor in sent.items():
        assert received[name].dtype == tensor.dtype and torch.equal(received[name], tensor)


# --- one local cluster, one engine of two actors --------------------------------------------


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    started = start_ray(None, num_cpus=2, temp_dir=str(tmp_path_factory.mktemp("ray")))
    yield
    if started:
        ray.shutdown()


@pytest.fixture(scope="module")
def policy():
    return tiny_model(seed=0)


@pytest.fixture(scope="module")
def engine(cluster, policy):
    with RayEngine(policy, TOKENIZER, 2, timeout_s=120, heartbeat_s=30) as engine:
        yield engine


def test_the_local_cluster_listens_on_loopback_only(cluster):
    assert ray.util.get_node_ip_address() == "127.0.0.1"
    assert {node["NodeManagerAddress"] for node in ray.nodes()} == {"127.0.0.1"}


def test_two_actors_equal_in_process_sampling_under_greedy_decoding(engine, policy):
    expected = HFEngine(policy, TOKENIZER).generate(PROMPTS, 3, 10, temperature=0.0)
    assert len(set(expected.completions)) >= 4 and 0 < expected.truncated.sum() < 15
    assert_same_batch(engine.generate(PROMPTS, 3, 10, temperature=0.0), expected)
    assert engine.generate(PROMPTS, 3, 10, 0.0).group_ids.tolist() == [i // 3 for i in range(15)]


def test_sampling_is_reproducible_from_the_host_generator_alone(engine):
    def sample(seed: int):
        generator = torch.Generator().manual_seed(seed)
        return engine.generate(["1+1="] * 4, 2, 12, 1.0, generator), generator

    (first, g1), (second, g2) = sample(7), sample(7)
    assert_same_batch(first, second)
    one_draw = torch.Generator().manual_seed(7)
    torch.randint(0, 2**62, (1,), generator=one_draw)
    assert torch.equal(g1.get_state(), one_draw.get_state())  # one draw per call, on the host
    assert torch.equal(g1.get_state(), g2.get_state())
    # the two actors are seeded apart: the same prompt first in each chunk samples differently
    assert first.completions[0:2] != first.completions[4:6]
    assert sample(8)[0].completions != first.completions


def test_loaded_weights_change_what_the_actors_sample(engine, policy):
    other = tiny_model(seed=1)
    expected = HFEngine(other, TOKENIZER).generate(PROMPTS, 2, 10, 0.0)
    before = HFEngine(policy, TOKENIZER).generate(PROMPTS, 2, 10, 0.0)
    assert expected.completions != before.completions
    try:
        engine.load_weights(other.state_dict())
        assert_same_batch(engine.generate(PROMPTS, 2, 10, 0.0), expected)
    finally:
        engine.load_weights(policy.state_dict())


def test_a_stopped_actor_times_out_naming_it_with_heartbeats(engine, capfd):
    pid = engine.pids[1]
    engine.timeout_s, engine.heartbeat_s = 2.0, 0.5
    os.kill(pid, signal.SIGSTOP)
    try:
        start = time.monotonic()
        with pytest.raises(WorkerError, match=re.escape(f"rollout actor 1 (pid {pid}): did not")):
            engine.generate(PROMPTS, 2, 10, 0.0)
        assert time.monotonic() - start < 4
    finally:
        os.kill(pid, signal.SIGCONT)
        engine.timeout_s, engine.heartbeat_s = 120.0, 30.0
    heartbeat = r"\[rlvr\] waiting for rollout actors (0, )?1 \(\d+ s\)"
    assert re.search(heartbeat, capfd.readouterr().err)
    assert len(engine.generate(PROMPTS, 1, 4, 0.0).completions) == 5  # it answers again


def test_more_actors_than_the_cluster_can_hold_is_one_line(cluster, policy):
    with pytest.raises(RayEngineError, match="need 3 CPUs, the Ray cluster has 2"):
        RayEngine(policy, TOKENIZER, 3, placement="separate")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without CUDA")
def test_nccl_weights_without_cuda_are_refused(cluster, policy):
    with pytest.raises(RayEngineError, match="--weight-transport nccl needs CUDA"):
        RayEngine(policy, TOKENIZER, 1, weight_transport="nccl")


def test_a_killed_actor_is_named_within_seconds_not_a_hang(cluster, policy):
    # colocated: asks Ray for no CPU, so it starts beside the module engine's two actors
    with RayEngine(policy, TOKENIZER, 1, placement="colocated", timeout_s=60) as doomed:
        pid = doomed.pids[0]
        os.kill(pid, signal.SIGKILL)
        start = time.monotonic()
        with pytest.raises(WorkerError, match=re.escape(f"rollout actor 0 (pid {pid}): died")):
            doomed.generate(PROMPTS, 2, 10, 0.0)
        assert time.monotonic() - start < 10


def test_an_actor_killed_mid_run_ends_it_naming_the_actor_and_the_last_checkpoint(
    cluster, policy, tmp_path
):
    """The loop's view: an actor dies during step 2 (killed by the reward function, between
    its sampling and the weight push); the run ends within seconds with the actor's name, the
    step-1 checkpoint and the resume command, not a hang."""
    from rlvr.report.run_dir import RunDirectory
    from rlvr.train.config import GRPOConfig, Monitor
    from rlvr.train.grpo import train_grpo

    model = copy.deepcopy(policy)
    engine = RayEngine(model, TOKENIZER, 1, placement="colocated", timeout_s=60)
    calls = []

    def reward(prompts, completions, **_):
        calls.append(1)
        if len(calls) == 2:
            os.kill(engine.pids[0], signal.SIGKILL)
        return [0.0] * len(completions)

    config = GRPOConfig(steps=4, prompts_per_step=2, group_size=2, max_new_tokens=6)
    config = dataclasses.replace(config, checkpoint_every=1, eval_every=0, monitor=Monitor(every=0))
    run = RunDirectory(tmp_path, "killed")
    rows = iter([{"prompt": p} for p in PROMPTS] * 10)
    start = time.monotonic()
    with engine, pytest.raises(WorkerError) as raised:
        train_grpo(
            model,
            TOKENIZER,
            rows,
            [reward],
            config,
            run,
            lambda m: {},
            seed=0,
            progress=False,
            engine=engine,
        )
    assert time.monotonic() - start < 30
    message = str(raised.value)
    assert message.startswith(f"rollout actor 0 (pid {engine.pids[0]}): died")
    assert f"checkpoints/step-000001; resume with: rlvr train --resume {run.path}" in message
