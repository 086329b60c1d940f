"""The fault suite behind `make faults` (benchmarks/faults.py): a cluster the suite owns, traffic with timings,
the faults themselves and the figures of each run. docs/reliability.md holds its table and what it found."""
