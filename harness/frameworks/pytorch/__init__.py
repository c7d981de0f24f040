"""PyTorch: the second framework (issue 34). Its interface: interface.py. Imports torch, never TensorFlow or
Horovod."""
