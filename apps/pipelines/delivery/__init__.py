"""Delivery of pipeline code: git sources and pushed directories, materialized as immutable revisions."""
