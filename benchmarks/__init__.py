"""Side-by-side speed benchmarks of the eager and optimized twins: the harness here (`python -m
benchmarks.run --help`), the studies that use it in `benchmarks.studies`."""
