"""Benchmarks: commands that measure the system and print (and save) their figures."""
