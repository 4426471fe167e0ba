"""bucketlearn: drop a CSV into a bucket, get a trained, versioned model."""

__version__ = "0.1.0"
