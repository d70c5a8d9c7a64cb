#!/usr/bin/env bash
# Installs Debian's python3-torch (PyTorch 1.13) when /usr/bin/python3 cannot
# import torch. Benchmarks only: the test suite never installs PyTorch.
set -euo pipefail
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  SUDO=""
  if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q python3-torch
fi
