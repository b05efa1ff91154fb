"""Benchmarks of the event log, run by ``python -m tests.bench`` (``make bench``), never by pytest.

Files are named ``bench_*.py`` so pytest's default collection (``test_*.py``) skips them; they
measure and print, they assert nothing about speed.
"""
