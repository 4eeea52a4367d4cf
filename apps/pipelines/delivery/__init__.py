"""Pipeline delivery: sources, immutable revisions, activation, and loading by revision."""
