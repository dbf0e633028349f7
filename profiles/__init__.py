"""The profile database: raw samples with provenance, shared and merged between teams (DESIGN §4)."""
