"""The deployment side: the generated table's format, the drop-in dispatcher and
``serving()``, the context its tuned entries serve in (inference mode, official flags).

Imports torch and the standard library only: no optuna, sqlalchemy, pandas, matplotlib.
"""

from autotune.runtime.dispatch import DispatchedTransformer, Route, contract_problems, serving
from autotune.runtime.table import DispatchTable, compatibility_problems, load_table

__all__ = [
    "DispatchTable",
    "DispatchedTransformer",
    "Route",
    "compatibility_problems",
    "contract_problems",
    "load_table",
    "serving",
]
