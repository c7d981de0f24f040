"""TensorFlow: the first framework (tf.keras, Horovod). Its interface: interface.py; the
workloads' Keras models: models.py. The only package of harness/ that imports TensorFlow
or Horovod (the top-level kernels/, its roofline micro-kernels, is reached from interface.py)."""
