"""Cost models: seconds and bytes for a task, its layout and its devices (DESIGN §5)."""
