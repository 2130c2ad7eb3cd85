#!/usr/bin/env bash
# The two ends of what pyproject.toml admits, each in a venv of its own beside .venv (which
# holds the lock, constraints/lock.txt):
#   bash scripts/check_versions.sh oldest   # transformers 5.0.0 (constraints/oldest.txt), the
#                                           # rest as locked: the sampler/learner agreement
#                                           # tests, the update's and the packed forward's
#   bash scripts/check_versions.sh newest   # every dependency at its newest allowed release:
#                                           # the default suite, so drift is seen
# CI (.ci/run) runs both. torch stays 2.13.0, the CPU build on these machines' disk (an
# unpinned torch pulls a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:?usage: scripts/check_versions.sh oldest|newest}
venv=".venv-$mode"
python3 -m venv "$venv"
. "$venv/bin/activate"
pip install -q torch==2.13.0
case "$mode" in
  oldest)
    # the lock minus the packages that move with transformers, then the oldest transformers
    grep -vE '^(transformers|tokenizers|huggingface[-_]hub|safetensors)==' constraints/lock.txt \
      > "$venv/constraints.txt"
    cat constraints/oldest.txt >> "$venv/constraints.txt"
    pip install -q -e ".[dev]" -c "$venv/constraints.txt"
    python -c "import transformers; print('transformers', transformers.__version__)"
    pytest tests/test_logprob_agreement.py tests/test_sampler.py tests/test_logprobs_chunked.py \
      tests/test_kv_cache.py tests/test_update.py tests/test_lora.py tests/test_engine.py \
      tests/test_packing.py
    ;;
  newest)
    pip install -q --upgrade -e ".[dev]"
    python -c "import transformers; print('transformers', transformers.__version__)"
    pytest
    ;;
  *)
    echo "usage: scripts/check_versions.sh oldest|newest" >&2
    exit 2
    ;;
esac
