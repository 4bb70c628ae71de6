"""Side-by-side speed benchmarks of the eager and optimized twins: `python -m benchmarks.run
--help`."""
