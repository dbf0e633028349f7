"""The prompts a run trains and validates on: the built-in set, local files, a resumable stream."""
