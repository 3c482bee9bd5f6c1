"""Speculative decoding: drafters propose draft tokens for a verification window; the verifier decides what is
kept.

base (the Drafter interface, which is also each drafter's declaration), lookup / retrieval / mtp (the drafters),
registry (the one list of drafter classes), options (DraftOptions, light: `guild --help` imports it), build
(make_drafter: a strategy's drafter), adaptive + scheduler (the cost-aware choice per window), costs (DraftCosts).
Nothing is imported here, so that importing the options does not pull in the drafters' Numba kernels.
"""
