"""The benchmark suite (`make bench`, `python -m bench`): each product figure beside its physical limit."""
