"""The dashboard's read side: registry documents -> rows and frames the page shows.

Everything here is a plain function of documents (and ``now``), so it is unit-tested without
Streamlit or a backend, and is handed what it reads (the page's Services come from its entry
point, ``dashboard/app.py``). The page, ``bucketlearn.entrypoints.dashboard``, only lays the
results out, importing the module of each part of the page; this package re-exports nothing. The dashboard never writes model state;
it writes the upload form's CSV (``actions.upload_csv``) and cancels a job with the core's
``cancel.cancel_job``, exactly what the CLI does.

* ``reads``: what the page reads and how often (``overview_bundle``,
  ``job_bundle``, the read limits, cache and refresh periods; the documents' fields);
* ``formats``: how a value is written (numbers, percentages, durations, dollars, times) and a
  user's string made safe for Markdown (``plain``);
* ``jobs_list``: the jobs overview's rows, a job's source and reason, the ``?job=`` parameter;
* ``headline``: the top of a job's page (summary, metric row, progress text, versions note);
* ``training``: the Training tab (the curve per version, a version's holdout report);
* ``throughput``: rate, ETA and progress, throughput over time, the plan and its forecast;
* ``workers_tasks``: the Workers & tasks tab (workers alive, task states, timings);
* ``costs``: the Usage & cost tab;
* ``options_data``: the Options & data tab (options, dataset facts, columns);
* ``downloads``: the Model tab (exported models, what can be downloaded);
* ``predictions``: the Batch predictions tab (a job's newest requests, shown when it has any);
* ``actions``: the "Cancel job" button's words and the upload form.
"""
