"""What the benchmarks and the tests share, so that neither imports the other: loading a script of
leanrl/ by path and building its env (`scripts`), ending a process tree (`processes`), and a
deterministic stand-in for an envpool env pool (`standin`)."""
