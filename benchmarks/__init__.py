"""bucketlearn benchmarks: side-by-side measurements, each figure a ratio against a baseline
measured in the same run on the same machine. Run with ``python -m benchmarks.run`` (``make bench``).
"""
