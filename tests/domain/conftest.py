"""The domain's tests: pure functions on plain values, no ports, no TensorFlow (the import
contract in pyproject.toml keeps the domain that way; ``test_the_domain_imports_nothing_heavy``
checks it in a fresh interpreter)."""
