"""Benchmarks: the cost model against published measurements (`advisor validate`)."""
