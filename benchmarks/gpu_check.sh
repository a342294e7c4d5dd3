#!/usr/bin/env bash
# A run's processes, and the GPU memory they hold, end with the run: benchmarks/gpu_check.py on GPU 0, once with
# the machine's containment (a cgroup where it can make one) and once with process tracking only
# (LABKUBE_CONTAINMENT=processes). Needs an NVIDIA GPU, PyTorch and labkube installed. Arguments go to the
# Python script (--record FILE, --gib N).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v nvidia-smi >/dev/null || { echo "no nvidia-smi: this check needs an NVIDIA GPU"; exit 2; }
python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null \
  || { echo "PyTorch with CUDA is missing: the holders allocate GPU memory with it"; exit 2; }
nvidia-smi --query-gpu=index,name,memory.total,memory.used,memory.free --format=csv
export RAY_AUTH_MODE=disabled
status=0
echo "== containment: auto"
python3 benchmarks/gpu_check.py "$@" || status=1
echo "== containment: processes (no cgroup)"
LABKUBE_CONTAINMENT=processes python3 benchmarks/gpu_check.py "$@" || status=1
nvidia-smi --query-gpu=index,memory.used,memory.free --format=csv
exit $status
