"""Modules the tests share (importable as `helpers.*`: pyproject's pytest `pythonpath` names tests/)."""
