"""TensorFlow: the first framework (tf.keras, Horovod). Its interface: interface.py."""
