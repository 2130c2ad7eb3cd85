"""Weight transport from the learner to the rollout actors, with no Ray in it: a state dict
packed as numpy arrays for Ray's object store (`pack_state_dict`, `unpack_state_dict`; each
tensor once, bfloat16 and float8 as their raw bits), and the "nccl" path, a broadcast group of
the learner and the actors apart from torch.distributed's default group (`weight_group`,
`broadcast_tensors`, `receive_tensors`; it needs CUDA and is untested here)."""

from __future__ import annotations

import dataclasses
import socket
import warnings
from collections.abc import Mapping
from datetime import timedelta

import numpy as np
import torch

WEIGHT_TRANSPORTS = ("object-store", "nccl")


# --- weights as numpy ----------------------------------------------------------------------


@dataclasses.dataclass
class PackedWeights:
    """A state dict as numpy arrays, for `ray.put`: each tensor once (tied weights are
    `aliases` of the first name sharing their memory), and dtypes numpy lacks (bfloat16,
    float8) stored as their raw bits in an integer array of the same width, named in
    `dtypes`, so nothing is rounded or doubled in size."""

    arrays: dict[str, np.ndarray]
    dtypes: dict[str, str]  # name -> torch dtype of arrays holding raw bits
    aliases: dict[str, str]  # name -> the name in `arrays` it shares memory with


_SAME_WIDTH_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def unique_tensors(
    state_dict: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """(tensors, aliases): the state dict with each tensor once, detached, and a map from each
    dropped name to the kept name viewing the same memory (tied embeddings)."""
    kept: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    first: dict[tuple, str] = {}
    for name, tensor in state_dict.items():
        key = (tensor.device, tensor.data_ptr(), tensor.dtype, tuple(tensor.shape), tensor.stride())
        if tensor.numel() and key in first:
            aliases[name] = first[key]
        else:
            first.setdefault(key, name)
            kept[name] = tensor.detach()
    return kept, aliases


def pack_state_dict(state_dict: Mapping[str, torch.Tensor]) -> PackedWeights:
    """The state dict as numpy arrays on the CPU (see `PackedWeights`); CPU float32 tensors
    are viewed, not copied (`ray.put` copies them into the object store)."""
    tensors, aliases = unique_tensors(state_dict)
    arrays, dtypes = {}, {}
    for name, tensor in tensors.items():
        tensor = tensor.cpu()
        try:
            arrays[name] = tensor.numpy()
        except TypeError:  # no numpy dtype: ship the bits
            arrays[name] = tensor.view(_SAME_WIDTH_INT[tensor.element_size()]).numpy()
            dtypes[name] = str(tensor.dtype).removeprefix("torch.")
    return PackedWeights(arrays, dtypes, aliases)


def unpack_state_dict(packed: PackedWeights) -> dict[str, torch.Tensor]:
    """The state dict `pack_state_dict` packed, as CPU tensors viewing the arrays (which the
    object store hands out read-only: engines copy them into their parameters)."""
    state_dict = {}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        for name, array in packed.arrays.items():
            tensor = torch.from_numpy(array)
            if name in packed.dtypes:
                tensor = tensor.view(getattr(torch, packed.dtypes[name]))
            state_dict[name] = tensor
    for name, target in packed.aliases.items():
        state_dict[name] = state_dict[target]
    return state_dict


# --- weights over a collective (GPUs) ------------------------------------------------------


def listening_socket(host: str) -> socket.socket:
    """A TCP socket listening at `host` on a free port: rank 0's end of a `weight_group`
    (torch's TCP store would otherwise listen on every interface)."""
    listener = socket.socket()
    listener.bind((host, 0))
    listener.listen()
    return listener


def weight_group(
    backend: str,
    host: str,
    port: int,
    rank: int,
    world_size: int,
    timeout_s: float,
    listener: socket.socket | None = None,
):
    """This process's member of a broadcast group of its own (rank 0 the learner, 1..N the
    actors), apart from torch.distributed's default group, which the learner may be using.
    Rank 0 passes the `listening_socket` at host:port (the group's TCP store takes it over);
    `backend` is "nccl" (GPUs) or "gloo" (CPUs, bound to `host`)."""
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(
        host,
        port,
        world_size,
        is_master=listener is not None,
        timeout=timeout,
        wait_for_workers=False,
        master_listen_fd=None if listener is None else listener.detach(),
    )
    if backend == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
    options = dist.ProcessGroupGloo._Options()
    options._timeout = timeout
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    return dist.ProcessGroupGloo(store, rank, world_size, options)


def broadcast_tensors(group, tensors: list[torch.Tensor], timeout_s: float) -> None:
    """Broadcast `tensors` from rank 0 of `group` in place, in order (every rank passes
    tensors of the same shapes and dtypes: rank 0 its values, the others buffers)."""
    for tensor in tensors:
        group.broadcast(tensor, 0, timedelta(seconds=timeout_s)).wait()


def tensor_specs(tensors: Mapping[str, torch.Tensor]) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape, dtype name) of each tensor: what a receiving rank allocates."""
    return [(n, tuple(t.shape), str(t.dtype).removeprefix("torch.")) for n, t in tensors.items()]


def receive_tensors(
    group, specs: list[tuple[str, tuple[int, ...], str]], device: str, timeout_s: float
) -> dict[str, torch.Tensor]:
    """Buffers for `specs` on `device`, filled by rank 0's `broadcast_tensors`."""
    tensors = {n: torch.empty(s, dtype=getattr(torch, d), device=device) for n, s, d in specs}
    broadcast_tensors(group, list(tensors.values()), timeout_s)
    return tensors
