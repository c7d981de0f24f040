"""The training frameworks, one package each behind one interface (issue 34, under way).

Table 2 of HPC AI500 V3.0 lets a user choose the framework: TensorFlow by default, PyTorch
beside it. What is built so far: `pytorch.flops`, Table 3 counted over a PyTorch model
at the operator level by harness/flops.py's rules; `pytorch.digits`, the digits CNN in
PyTorch; `pytorch.kernels`, the roofline micro-kernels in PyTorch. TensorFlow's training
still lives in harness/train.py and the workloads' modules; moving it here, behind the interface the PyTorch package will share (build the
model, train a base model on a job's group, exchange gradients, count FLOPs, run the
kernels, predict), is the rest of issue 34. No framework is imported by this file.
"""
