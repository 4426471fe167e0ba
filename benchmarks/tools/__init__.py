"""Programs the benchmarks start or a person runs by hand, beside the suites: a contender of the
ingest benchmark in a fresh process (``ingest_worker``), ``train-local`` timed in a child process
(``train_local``), the merge of parity runs (``merge_parity``) and the Firestore write counter
the scale benchmark loads into the stack's processes (``fscount/sitecustomize.py``)."""
