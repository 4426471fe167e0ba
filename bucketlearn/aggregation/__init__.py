"""A job's single writer: results folded into versions (``writer``), the long-running process that
serves jobs under leases (``process``), their evaluation (``evaluators``), the refusal of bad
results, a search's writer and the wind-up of an ended job."""
