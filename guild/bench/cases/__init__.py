"""The benchmark cases: one module per benchmark, each ≤ 120 lines on the harness."""
