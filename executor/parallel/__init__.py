"""How a plan's tasks spread over ranks: topology, process groups, tensor/pipeline parallelism, weight sync."""
