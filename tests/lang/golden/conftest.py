# Helper modules of the golden files that end their importer on purpose (a .wf imports them to
# test that `check` survives it): pytest's --doctest-modules must not import them itself.
collect_ignore = ["bad/exits_at_import.py", "bad/interrupts_at_import.py"]
