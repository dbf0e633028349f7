"""The torch.distributed runtime that carries a plan out and records what it measured (DESIGN §7)."""
