"""A batch prediction request's work in stages, each timed on its own in this process (started by
``benchmarks.suites.batch_predict`` in the local stack's environment, TensorFlow on one thread as
the upload function has it); prints one JSON line of seconds (and bytes).

    python -m benchmarks.tools.predict_stages MODEL FILE OBJECT GENERATION

The request does these in one pass (its input read ahead by a thread); here they run one after
another, so their sum is an upper bound on the request's own ``seconds``:

* ``load_model``: the ``.keras`` file loaded (``LoadedModel.load``);
* ``read_type_predict``: FILE (the request's input, on local disk) read a block at a time, its
  feature columns typed and the model called (``prediction_rows.predicted_rows``, as the request
  and ``bucketlearn predict`` do); the batches are kept for the next two stages;
* ``model``: the model alone on the same typed batches (``prediction_rows.model_outputs``): the
  share of ``read_type_predict`` that is TensorFlow;
* ``model_8192_rows_a_call`` (a raw-row model only): the same, the model called on 8,192 rows
  at a time instead of ``PREDICT_BATCH_ROWS`` (1,024): what the calls' own overhead costs;
* ``encode_output``: the output CSV's bytes made from the kept batches
  (``batch_predict.csv_chunks``: every input cell quoted, the prediction, the probabilities);
* ``storage_read``: OBJECT's GENERATION (the uploaded input) read from the uploads bucket in
  4 MiB blocks, as the request reads it;
* ``storage_write``: those output bytes written to the models bucket through ``write_stream``
  (a resumable upload in 16 MiB chunks), as the request writes them (then deleted).
"""

from __future__ import annotations

import json
import os
import sys
import time
import uuid


def main(model: str, path: str, name: str, generation: int) -> None:
    import keras  # noqa: F401 - imported before the clock starts, as the function has it

    from bucketlearn.bootstrap import google_services
    from bucketlearn.config import Limits, load_settings
    from bucketlearn.ingest.stream import SourceFile
    from bucketlearn.usecases.batch_predict import ChunkStream, csv_chunks
    from bucketlearn.usecases.prediction_rows import (
        LoadedModel,
        model_outputs,
        predict_raw_rows,
        predicted_rows,
        unbounded,
    )

    svc = google_services(load_settings())
    seconds: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(stage: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        seconds[stage] = now - clock
        clock = now

    loaded = LoadedModel.load(model)
    lap("load_model")
    source = SourceFile(display_name=path, size=os.path.getsize(path),
                        opener=lambda: open(path, "rb"))  # noqa: SIM115 - closed by ingest
    _, batches = predicted_rows(source, loaded, unbounded(Limits()))
    kept = list(batches)
    lap("read_type_predict")
    for batch in kept:
        model_outputs(loaded, batch.typed, batch.rows)
    lap("model")
    inputs = loaded.sidecar.get("inputs")
    if inputs:  # a raw-row model: the same calls on 8,192 rows at a time, not 1,024
        for batch in kept:
            predict_raw_rows(loaded.model, batch.typed, inputs, batch.rows, batch=8192)
        lap("model_8192_rows_a_call")
    chunks = list(csv_chunks(loaded, iter(kept)))
    lap("encode_output")
    read = 0
    with svc.store.open_read(svc.settings.uploads_bucket, name, generation=generation) as handle:
        while block := handle.read(4 << 20):
            read += len(block)
    lap("storage_read")
    target = f"bench-stages/{uuid.uuid4().hex}.csv"
    svc.store.write_stream(svc.settings.models_bucket, target, ChunkStream(iter(chunks)),
                           "text/csv")
    lap("storage_write")
    svc.store.delete(svc.settings.models_bucket, target)
    print(json.dumps({"seconds": seconds, "rows": sum(b.rows for b in kept),
                      "input_bytes": read, "output_bytes": sum(len(c) for c in chunks)}))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if len(sys.argv) != 5:
        raise SystemExit("usage: python -m benchmarks.tools.predict_stages MODEL FILE OBJECT "
                         "GENERATION")
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]))
