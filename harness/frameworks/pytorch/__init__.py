"""PyTorch: the second framework (issue 34). Imports torch, never TensorFlow or Horovod."""
