"""Test-wide settings."""

import os

import torch

# Tests run tiny models beside JVMs on a 2-core machine: one torch thread avoids
# OpenMP spin-wait thrash that makes tiny matmuls ~20x slower.
torch.set_num_threads(1)
os.environ.setdefault("OMP_NUM_THREADS", "1")
