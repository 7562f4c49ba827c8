"""Reading measurements: traces, kernel tables, plots, the results table and the book's short
labels."""
