"""What the suites measure with: paths, processes and the environment (``procs``), timing and
summary figures (``figures``), generated and public data (``data``, ``datasets``, ``public``),
the local stack (``stack``), ``train-local`` in a child process (``serial``) and the in-process
training loop the aggregation studies vary (``experiment``). Nothing here imports a suite, the
runner or the report.
"""
