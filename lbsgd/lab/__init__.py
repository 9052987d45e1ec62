"""The lab: what replays and decides a study, on the library below it (docs/ARCHITECTURE.md).

Studies and their notebooks' API, sweeps and their launchers, findings and their statistics, the
report, ``lbsgd verify``, ``lbsgd execute`` and ``lbsgd reproduce``. The lab imports the library;
nothing of the library imports the lab (``tests/test_layers.py``)."""
