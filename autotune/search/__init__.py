"""The search: declarative spaces, trial records in Optuna storage, studies, isolated
trial runners and workers, and search efficiency against exhaustive tuning."""
