"""Trace analysis: readers → canonical polars frames → steps, walls, graph, audit."""
