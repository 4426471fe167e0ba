"""The rules of training, as plain objects and pure functions: no storage, no queue, no
TensorFlow. Services read, call these, and write."""
