"""The torch.distributed runtime that carries a plan out and records what it measured (DESIGN §7).

  cli.py, options.py   `hetprof run` / `hetprof validate`, and what every worker is handed
  launch/      checks before any worker, the elastic launch, a worker's first code
  loop/        one rank's iteration dataflow (worker.py), the leader's part, staleness, messages
  runners/     one runner per task behind the TaskRunner protocol, a registry keyed by Task
  parallel/    the plan as ranks: topology, process groups, TP/PP sharding, weight sync
  records/     iteration reports, the recorder, run records, TensorBoard, traces, Gantt charts
  checkpoints/ atomic checkpoints, resume, Hugging Face exports
  models/      model builders, tokenizers, log-prob and packed passes
  prompts/     the prompts a run trains and validates on
  algorithms/  RL algorithms (a registry), the learner and its optimizer
  backends/    generation backends (a registry): HF, vLLM
"""
