"""Starting a run: the command's checks before any worker, the elastic launch, and a worker's first code."""
