"""The guarantee matrix: every way of running ART on the store, through failures and kills.

tests/training/test_guarantee_matrix.py draws cases (cases.py) with Hypothesis; each runs a small
run of a pattern (patterns.py) in child processes (child.py, harness.py) on a fresh
database (databases.py) and then checks the same invariants (invariants.py).
"""
