"""The sections of `make bench`, a module each (bench/registry.py finds them all): what each
measures, its typed result, and its part of BENCHMARKS.md."""
