"""What people see of a store: one read model (read_model: store rows in, a View out, by the loop's
rules) and its faces: the dashboard, `autoresearch status`, the results table and results.tsv, the
chart, the research log's text and the demo's live display (terminal)."""
