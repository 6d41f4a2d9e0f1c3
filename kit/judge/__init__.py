"""The optional Claude judge (the `anthropic` SDK) behind a hard dollar budget.

    judge.py   Judge: rubric scores and expert feedback, the budget ledger, cache and retries
    pairs.py   preference pairs from the judge (both orders; a tie when they disagree)

May import: kit.env (secrets), the standard library, anthropic (lazily: a missing SDK turns the judge off).
"""
