"""One runner per task of the RL iteration, behind the TaskRunner protocol and a registry keyed by Task."""
