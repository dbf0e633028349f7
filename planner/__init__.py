"""RL task graph, plan simulator, searches and baselines (DESIGN §6).

How the pieces fit (each module has one job; searches only propose, the simulator judges):

- `graph`: the RL workflow as tasks and edges (what travels: rollouts forward, weights back)
- `candidate`: what a search proposes (groups, their GPUs, each task's `hetprof.specs.TaskLayout`)
- `links`: every host pair's α–β link, measured (profile DB) over the spec
- `taskcosts`: a layout's replica times (cost model per stage over real links, length waves) and memory
- `schedule`: several iterations played on the groups (sync/async, streaming) -> steady state
- `simulator`: structure and memory checks, transfers, $ -> `Score` (the single source of truth)
- `search/` (with `search/layouts`): the searches and layout balancers, scored by the simulator
- `memcheck`: an independent memory check of plan files
- `report`, `gantt`, `whatif`, `session`, `cli`: what `hetprof plan` shows, draws, changes and runs
  (`session.build_plan` writes a candidate and its score as the plan file)
"""
