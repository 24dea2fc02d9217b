"""`make bench`: the benchmarks behind BENCHMARKS.md (bench/run.py drives them). Dev-only: never
in the wheel."""
