"""The torch.distributed runtime that carries a plan out and records what it measured (DESIGN §7).

  cli.py, options.py   `hetprof run` / `hetprof validate`, and what every worker is handed
  launch/      checks before any worker, the elastic launch, a worker's first code
  loop/        one rank's iteration dataflow (worker.py), the leader's part and its recorder, weight-sync
               edges, staleness, messages
  runners/     one runner per task behind the TaskRunner protocol, a registry keyed by Task
  parallel/    the plan as ranks: topology, batch shares, process groups, TP/PP sharding, weight sync
  records/     iteration reports, run records and names, TensorBoard, W&B, traces, Gantt charts
  checkpoints/ atomic checkpoints, resume, Hugging Face exports
  models/      model builders, tokenizers, log-prob and packed passes
  prompts/     the prompts a run trains and validates on
  algorithms/  RL algorithms (a registry), the learner and its optimizer
  backends/    generation backends (a registry): HF, vLLM

Imports run one way: each folder imports only folders before it in LAYERS (options.py is
everyone's). A runner does its task; the loop wires runners, sync edges and the recorder together.
"""

LAYERS = ("models", "backends", "prompts", "algorithms", "records", "parallel", "runners", "checkpoints", "loop",
          "launch")
