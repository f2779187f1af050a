"""Declarative search spaces: one module per family, each defining ``SPACE`` (plain data).

A space says which profiles and case regimes it serves, its parameters (plain knob
values, or grouped *variants* that set several knobs together so invalid combinations
are never proposed), conditions (``when``: a parameter exists only when earlier
knobs have given values), restrictions (``forbid``: combinations never run), knobs held
fixed, and plans to enqueue first. ``autotune/space.py`` loads and hashes them. Users
add or override spaces with ``--space FILE`` or the ``AUTOTUNE_SPACES`` folder.
"""
