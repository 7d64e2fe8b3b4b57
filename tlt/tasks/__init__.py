"""Built-in reasoning tasks and dataset loading."""
