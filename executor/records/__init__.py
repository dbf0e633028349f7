"""What a run measured: iteration reports, the recorder, run records, TensorBoard, traces and Gantt charts."""
