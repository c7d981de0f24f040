"""The training frameworks, one package each behind one interface (issue 34, under way).

Table 2 of HPC AI500 V3.0 lets a user choose the framework: TensorFlow by default, PyTorch
beside it (lines 34-35 of the input file, a sweep like the workloads). This module is
the registry: CHOICES (the input file's keywords, their T/V codes and meanings) and
`missing(name)`, which says, without importing anything, why a framework cannot run
on this node (its packages not installed), so that `--check` refuses the input before
any rank imports a framework. No framework is imported by this file.

What is built in harness/frameworks/pytorch/ so far: `flops`, Table 3 counted over a
PyTorch model at the operator level by harness/flops.py's rules; `digits`, the digits
CNN in PyTorch; `kernels`, the roofline micro-kernels in PyTorch. TensorFlow's training
still lives in harness/train.py and the workloads' modules; moving it here, behind the
interface the PyTorch package will share (build the model, train a base model on a
job's group, exchange gradients, count FLOPs, run the kernels, predict), is the rest of
issue 34, as is PyTorch's training loop: until it is built, harness/plan.py refuses a
test whose framework is pytorch, saying so.
"""
from __future__ import annotations

import importlib.util

# Line 35's choices: name -> (T/V code, meaning). TensorFlow's code is empty, so that the
# T/V codes of every run from before the framework line read as they did.
CHOICES = {"tensorflow": ("", "TensorFlow 2 (tf.keras) with Horovod for the gradient exchange"),
           "pytorch": ("PT", "PyTorch with torch.distributed (DistributedDataParallel)")}

# What each framework's training imports: name -> (module, the pip requirement that brings it).
REQUIRES = {"tensorflow": (("tensorflow", "tensorflow (requirements.txt)"),
                           ("horovod", "horovod (requirements.txt, built by make venv)")),
            "pytorch": (("torch", "torch (requirements-pytorch.txt)"),)}

# The frameworks a base model can be trained with today, and what is missing in the others.
TRAINING = ("tensorflow",)
NOT_YET = {"pytorch": "PyTorch's FLOP count and roofline micro-kernels are built (harness/frameworks/pytorch/), its"
                      " training loop on torch.distributed is not yet (issue 34)"}


def missing(name: str) -> list[str]:
    """The requirements of framework `name` that this Python cannot import (found
    without importing them: importlib's finder only), e.g. ['torch (requirements-
    pytorch.txt)']; [] where it can run."""
    return [need for module, need in REQUIRES[name] if importlib.util.find_spec(module) is None]
