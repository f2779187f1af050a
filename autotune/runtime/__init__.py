"""The deployment side: the generated table's format and the drop-in dispatcher.

Imports torch and the standard library only: no optuna, sqlalchemy, pandas, matplotlib.
"""

from autotune.runtime.dispatch import DispatchedTransformer, Route
from autotune.runtime.table import DispatchTable, compatibility_problems, load_table

__all__ = [
    "DispatchTable",
    "DispatchedTransformer",
    "Route",
    "compatibility_problems",
    "load_table",
]
