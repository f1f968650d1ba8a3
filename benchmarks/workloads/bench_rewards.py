"""The reward of the TRL comparison workload, shared by both trainers (benchmarks/bench_vs_trl.py)."""


def digit_share(text: str, target: int) -> float:
    """The share of ``text``'s characters that are the digit ``target`` (0 for empty text).

    >>> digit_share("3a33", 3)
    0.75
    """
    return sum(ch == str(target) for ch in text) / len(text) if text else 0.0
