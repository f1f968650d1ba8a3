"""A user tools module whose two tools return different types (for a golden error test)."""


def notes(x: int) -> str:
    return str(x)


def count(x: int) -> int:
    return x
