"""A user module whose extractor takes two arguments (for a golden error test)."""


def two_args(text: str, base: int) -> int:
    return int(text) + base
