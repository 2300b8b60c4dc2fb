"""After-the-run tools: per-run report, comparison of two results, sweep tables.
Never imported by a running benchmark (nothing here runs inside a timed window)."""
