"""What a request or an event asks of the pipeline: an upload split and its job started
(``upload``), a job cancelled, its status read or waited on, a round or a search's segments
published, models downloaded and predicted with, ``train-local``."""
