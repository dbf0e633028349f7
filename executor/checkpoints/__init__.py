"""Checkpoints: atomic tensor files, where a run resumes, and Hugging Face exports beside them."""
