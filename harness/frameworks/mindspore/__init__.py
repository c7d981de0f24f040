"""MindSpore: the third framework (issue 47). Its interface: interface.py. Imports MindSpore, never TensorFlow,
Horovod or PyTorch."""
