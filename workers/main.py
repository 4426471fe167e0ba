"""Learner worker entry point (the container's command): pull tasks until SIGTERM."""

from bucketlearn.services.learn import main

if __name__ == "__main__":
    main()
