"""Reading measurements: traces, kernel tables, plots and the results table."""
