"""Everything that reads the store for people: the dashboard, `autoresearch status`, the results
table and results.tsv, and the chart."""
