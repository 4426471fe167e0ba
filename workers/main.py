"""Learner worker entry point (the container's command): pull tasks until SIGTERM."""

from bucketlearn.entrypoints.worker import main

if __name__ == "__main__":
    main()
