"""guild's benchmarks: one harness (harness.py), one record schema (record.py), every benchmark a case
(cases/); `python -m guild.bench`."""
