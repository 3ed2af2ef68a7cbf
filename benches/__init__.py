"""Benchmarks: commands that print figures measured in one run, as ratios (never timed tests).
The folders mirror the packages they measure: `python -m benches.zoo.bench_kernels`,
`python -m benches.budgets.bench_ranks`, `python -m benches.train.harness.bench_monitor`, ..."""
