"""What a run measured: iteration reports, run records, TensorBoard, W&B, traces and Gantt charts."""
