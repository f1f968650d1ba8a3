"""A helper module whose import raises KeyboardInterrupt (a BaseException, not an Exception)."""
raise KeyboardInterrupt("raised at import")
