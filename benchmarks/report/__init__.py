"""What a benchmark's figures become: the result JSON every suite fills and writes
(``results``), the markdown tables (``markdown``) and the generated section of
docs/BENCHMARKS.md (``doc``). A suite's own tables stay in the suite; the report finds them
through the registry (``benchmarks.suites.SUITES``)."""
