"""The studies: one question each, measured beside the harness of benchmarks/ (whose run, registry,
report, plots and machine modules they use): `python -m benchmarks.studies.<name> --help`."""
