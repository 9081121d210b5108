#!/usr/bin/env bash
# Re-exports the PyTorch model zoo of the ONNX tests, by both of PyTorch's exporters, with
# PyTorch's float64 outputs (and torch.autograd's gradients) as references:
#
#   tests/onnx/torch/    embedding classifier, cross-entropy heads, nn.LSTM, nn.GRU, a top-2
#                        mixture of experts, a GPT-style language model (torch_models.py)
#   tests/onnx/dynamic/  the same kinds with dynamic batch and sequence axes, and a
#                        Llama-style block, at two sizes each (torch_dynamic.py)
#   tests/onnx/cnn/      a small CNN classifier, a ResNet basic block, grouped, dilated and
#                        depthwise convs with pools (torch_cnn.py)
#
# Usage: benches/export_torch_models.sh [PYTHON] (a Python with torch, onnx and onnxscript;
# default /work/peers-venv/bin/python). The tests read the committed files and need no
# PyTorch; run this only to change the zoo, then run the tests and commit what changed.
set -euo pipefail
python="${1:-/work/peers-venv/bin/python}"
root="$(cd "$(dirname "$0")/.." && pwd)"
"$python" "$root/tests/onnx/torch_models.py" "$root/tests/onnx/torch"
"$python" "$root/tests/onnx/torch_dynamic.py" "$root/tests/onnx/dynamic"
"$python" "$root/tests/onnx/torch_cnn.py" "$root/tests/onnx/cnn"
