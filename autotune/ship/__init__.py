"""From studies to a table: finalists re-measured, winners selected, the table written."""
