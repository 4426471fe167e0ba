"""The holdout figure of the mean of the best k finalists of a search, k = 1 to 4, on one table:
what chose to average all four (docs/TRAINING.md, "The search"). Tuning tables only.

    python -m benchmarks.tools.search_prefixes TABLE

Prints one JSON line: the finalists (best first), each prefix's holdout figure and loss
(``top<k>``; accuracy in %, R² for a numeric target) and validation score (``val<k>``).
"""

from __future__ import annotations

import json
import sys
from typing import Any


def main(name: str) -> None:
    import bucketlearn.usecases.local_search as search
    from benchmarks.harness.baseline import source
    from benchmarks.harness.paths import CACHE
    from bucketlearn.bootstrap import memory_services
    from bucketlearn.ingest.parts import load_parts
    from bucketlearn.ml.model import ensemble_model
    from bucketlearn.ml.training import evaluate_detail
    from bucketlearn.options import JobOptions
    from bucketlearn.services.evaluate import validation_score

    path, given = source(name, CACHE)
    svc = memory_services()
    seen: dict[str, Any] = {}
    select = search._select

    def keep(lines, standings, finalists, sample, spec):  # what the search selects from
        seen.update(lines=lines, standings=standings, finalists=finalists, sample=sample,
                    spec=spec)
        return select(lines, standings, finalists, sample, spec)

    search._select = keep
    result = search.search_local(str(path), JobOptions(**given, seed=0), 8, svc=svc)
    lines, finalists, spec = seen["lines"], seen["finalists"], seen["spec"]
    x, y = load_parts(svc.store, svc.settings.work_bucket, result.manifest.holdout_parts)
    out: dict[str, Any] = {"table": name, "finalists": finalists}
    for k in range(1, len(finalists) + 1):
        model = (lines[finalists[0]].model if k == 1 else
                 ensemble_model([lines[i].model for i in finalists[:k]]))
        found = evaluate_detail(model, None, x, y, spec.task)
        out[f"top{k}"] = [found.report["r2"] if spec.regression else 100 * found.accuracy,
                          found.loss]
        out[f"val{k}"] = validation_score(model, None, *seen["sample"], spec, 0, 0).to_dict()
    print(json.dumps(out))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python -m benchmarks.tools.search_prefixes TABLE")
    main(sys.argv[1])
