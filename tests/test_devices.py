"""Device and precision choice: resolved once, before any model loads."""

from __future__ import annotations

import pytest
import torch

from rlvr import devices
from rlvr.cli import main
from rlvr.devices import DeviceError, generator_on, resolve_precision

no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")


def test_auto_is_the_cpu_in_float32_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA machine resolves auto to cuda")
    precision = resolve_precision("auto", "auto")
    assert precision.device == torch.device("cpu") and precision.dtype == torch.float32
    assert precision.is_cpu and precision.describe() == "cpu, float32"


@no_cuda
@pytest.mark.parametrize("spec", ["cuda", "cuda:0", "CUDA:1"])
def test_cuda_without_cuda_is_one_line_naming_the_flag(spec):
    with pytest.raises(DeviceError) as err:
        resolve_precision(spec)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"--device {spec.lower()}")
    assert "--device cpu" in message


@pytest.mark.parametrize("spec", ["gpu", "cuda:x", "tpu:0", ""])
def test_an_unknown_device_names_the_choices(spec):
    with pytest.raises(DeviceError, match="auto, cpu, cuda or cuda:N"):
        resolve_precision(spec)


def test_an_unknown_dtype_names_the_choices():
    with pytest.raises(DeviceError, match="auto, float32, bfloat16"):
        resolve_precision("cpu", "float16")


def test_bf16_on_a_cpu_without_it_warns_and_falls_back(monkeypatch, capsys):
    monkeypatch.setattr(devices, "cpu_has_bf16", lambda: False)
    assert resolve_precision("cpu", "bfloat16").dtype == torch.float32
    assert "running in float32" in capsys.readouterr().err


def test_bf16_on_a_cpu_with_it_autocasts_matmuls_and_keeps_float32_weights(monkeypatch):
    monkeypatch.setattr(devices, "cpu_has_bf16", lambda: True)
    precision = resolve_precision("cpu", "bfloat16")
    assert precision.dtype == torch.bfloat16 and "autocast" in precision.describe()
    layer = torch.nn.Linear(4, 4)
    with precision.autocast():
        out = layer(torch.ones(2, 4))
    assert out.dtype == torch.bfloat16 and layer.weight.dtype == torch.float32
    with resolve_precision("cpu", "float32").autocast():
        assert layer(torch.ones(2, 4)).dtype == torch.float32


def test_generator_on_keeps_a_generator_already_there_and_derives_one_otherwise():
    host = torch.Generator().manual_seed(3)
    assert generator_on(host, torch.device("cpu")) is host
    assert generator_on(None, torch.device("cpu")) is None
    # elsewhere (here "cpu:0", which torch treats as another device) a new generator is
    # seeded by one draw of the host one: reproducible from the host's seed, and it advances
    hosts = [torch.Generator().manual_seed(3) for _ in range(2)]
    derived = [generator_on(h, torch.device("cpu:0")) for h in hosts]
    assert derived[0] is not hosts[0]
    assert derived[0].initial_seed() == derived[1].initial_seed()
    assert hosts[0].get_state().equal(hosts[1].get_state())
    assert not hosts[0].get_state().equal(torch.Generator().manual_seed(3).get_state())


@no_cuda
def test_train_with_device_cuda_fails_before_anything_is_written(tmp_path, capsys):
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--device", "cuda", "--runs-dir", str(runs), "--no-progress"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--device cuda" in err[0] and "no CUDA device" in err[0]
    assert not runs.exists()


@no_cuda
@pytest.mark.parametrize("command", ["eval", "sample", "pipeline"])
def test_every_model_command_refuses_cuda_without_it(command, tmp_path, capsys):
    extra = {
        "eval": ["--model", str(tmp_path)],
        "sample": ["--model", str(tmp_path), "--output", str(tmp_path / "o.jsonl")],
        "pipeline": ["--out-dir", str(tmp_path / "p")],
    }[command]
    with pytest.raises(SystemExit) as exit_info:
        main([command, *extra, "--device", "cuda"])
    assert exit_info.value.code == 2
    assert "--device cuda" in capsys.readouterr().err
    assert not (tmp_path / "o.jsonl").exists() and not (tmp_path / "p").exists()
