"""Several RL iterations played out on the groups, to read off the steady-state iteration time.

Each group runs its tasks one after another (iteration-major, graph order within an iteration);
a task starts when its group is free, its inputs have arrived and — for generation — the weights it
may use are ready: those of the previous step when synchronous, of k steps earlier with staleness k.
Work flows in K chunks: when streaming, a consumer in another group starts on the first finished
chunk and never overtakes its input (StreamRL's dynamic-batch pipelining); otherwise it waits for
everything. Playing several iterations lets async overlap and cross-iteration dependencies appear
without special cases; the steady state is the spacing of the last iterations' ends.

Because every start time is a max of sums of non-negative terms under a fixed order, slower links or
longer tasks can never make the schedule shorter, and relaxing a dependency (async) can never make it
longer — the properties the tests check.
"""

from __future__ import annotations

import dataclasses
import math

from hetprof.planner.graph import Edge


@dataclasses.dataclass(frozen=True)
class Event:
    """One bar of the Gantt chart: a task, a transfer, an offload or a weight sync."""

    name: str
    devices: tuple[str, ...]
    start: float
    end: float
    kind: str  # "compute" | "offload" | "transfer" | "weights"
    group: int = -1


@dataclasses.dataclass(frozen=True)
class ScheduleInput:
    tasks: tuple[str, ...]                 # graph order
    group_of: dict[str, int]
    curve: dict[str, tuple[float, ...]]    # per task: time from compute start until chunk j is done
    swap: dict[str, tuple[float, float]]   # per task: reload before, offload after (seconds)
    forward: tuple[tuple[Edge, float], ...]   # forward edges and their full transfer seconds
    weights: tuple[tuple[Edge, float], ...]   # back edges and their sync seconds
    staleness: int                         # 0: synchronous
    streaming: bool
    iterations: int
    group_devices: dict[int, tuple[str, ...]]
    task_devices: dict[str, tuple[str, ...]]


@dataclasses.dataclass
class _Node:
    task: str
    it: int
    start: float = 0.0
    end: float = 0.0
    compute_start: float = 0.0
    out: list[float] = dataclasses.field(default_factory=list)
    arrivals: dict[str, list[float]] = dataclasses.field(default_factory=dict)   # edge name -> per chunk
    start_by: tuple = ("none",)
    tail_by: tuple | None = None


@dataclasses.dataclass(frozen=True)
class ScheduleResult:
    iteration_s: float
    breakdown: dict[str, float]
    iteration_ends: tuple[float, ...]


def simulate(inp: ScheduleInput) -> ScheduleResult:
    """Steady-state seconds per iteration and the critical-path breakdown."""
    return _play(inp)[0]


def timeline(inp: ScheduleInput) -> tuple[Event, ...]:
    """The events of one steady-state iteration (the last one played), times from its start.

    Built on demand only: searches never look at it, and it is most of a schedule's cost.
    """
    # Play past the window so the next steps' work that overlaps it (async) is there too; earlier
    # nodes never depend on later ones, so the window itself is unchanged.
    longer = dataclasses.replace(inp, iterations=inp.iterations + inp.staleness + 1)
    _, nodes, weight_ready, ends = _play(longer)
    last = inp.iterations - 1
    window = (ends[last - 1] if inp.iterations > 1 else 0.0, ends[last])
    return _timeline(inp, nodes, weight_ready, window, last)


def _play(inp: ScheduleInput) -> tuple[ScheduleResult, dict, dict, list[float]]:
    k = len(next(iter(inp.curve.values())))
    nodes: dict[tuple[str, int], _Node] = {}
    weight_ready: dict[tuple[str, int], float] = {}      # (back edge name, iteration of its source) -> time
    group_free: dict[int, tuple[float, tuple]] = {}
    forward_in: dict[str, list[tuple[Edge, float]]] = {t: [] for t in inp.tasks}
    for edge, seconds in inp.forward:
        forward_in[edge.dst].append((edge, seconds))
    weights_in: dict[str, list[tuple[Edge, float]]] = {t: [] for t in inp.tasks}
    weights_out: dict[str, list[tuple[Edge, float]]] = {t: [] for t in inp.tasks}
    for edge, seconds in inp.weights:
        weights_in[edge.dst].append((edge, seconds))
        weights_out[edge.src].append((edge, seconds))
    ends = []
    for it in range(inp.iterations):
        it_end = 0.0
        for task in inp.tasks:
            g = inp.group_of[task]
            node = _Node(task, it)
            free, free_by = group_free.get(g, (0.0, ("none",)))
            start, start_by = free, free_by
            need = [-math.inf] * k
            for edge, seconds in forward_in[task]:
                src = nodes[(edge.src, it)]
                arrival = _arrivals(src, seconds, k, streaming=inp.streaming and inp.group_of[edge.src] != g)
                node.arrivals[edge.name] = arrival
                need = [max(a, b) for a, b in zip(need, arrival, strict=True)]
                if arrival[0] > start:
                    start, start_by = arrival[0], ("edge", edge, (edge.src, it), arrival[0])
            for edge, _seconds in weights_in[task]:
                ready = weight_ready.get((edge.name, it - 1 - inp.staleness))
                if ready is not None and ready > start:
                    start, start_by = ready, ("weights", edge, (edge.src, it - 1 - inp.staleness), ready)
            pre, post = inp.swap.get(task, (0.0, 0.0))
            node.start, node.start_by = start, start_by
            node.compute_start = start + pre
            curve = inp.curve[task]
            if need[0] == need[-1]:  # nothing streams in: all input is there before the compute starts
                begin = max(node.compute_start, need[-1])
                node.out = [begin + c for c in curve]
                prev = node.out[-1]
            else:
                prev, done = node.compute_start, 0.0
                for j in range(k):
                    chunk = curve[j] - done
                    done = curve[j]
                    if need[j] > prev:
                        prev = need[j] + chunk
                        if j == k - 1:
                            node.tail_by = _tail_binder(node, forward_in[task], it)
                    else:
                        prev += chunk
                    node.out.append(prev)
            node.end = prev + post
            nodes[(task, it)] = node
            group_free[g] = (node.end, ("group", (task, it)))
            it_end = max(it_end, node.end)
            for edge, seconds in weights_out[task]:
                ready = node.end + seconds
                # A transfer, not compute: the group may run other work meanwhile; only the
                # consumer waits for it (through its dependency).
                weight_ready[(edge.name, it)] = ready
        ends.append(it_end)
    m = 2 if inp.iterations >= 3 else 1
    last = inp.iterations - 1
    iteration_s = (ends[last] - ends[last - m]) / m if inp.iterations > m else ends[last]
    lo = ends[last - m] if inp.iterations > m else 0.0
    breakdown = _critical_path(inp, nodes, lo, last)
    breakdown = {name: s / m for name, s in breakdown.items() if s > 1e-12}
    return ScheduleResult(iteration_s, breakdown, tuple(ends)), nodes, weight_ready, ends


def _arrivals(src: _Node, seconds: float, k: int, streaming: bool) -> list[float]:
    """When each chunk of `src`'s output is on the consumer's side of the edge."""
    if not streaming:
        at = src.out[-1] + seconds
        return [at] * k
    per = seconds / k
    out, prev = [], -math.inf
    for j in range(k):
        prev = max(src.out[j], prev) + per
        out.append(prev)
    return out


def _tail_binder(node: _Node, inputs: list[tuple[Edge, float]], it: int) -> tuple | None:
    """The input whose last chunk arrived latest (it bound this node's end)."""
    best = None
    for edge, _ in inputs:
        at = node.arrivals[edge.name][-1]
        if best is None or at > best[3]:
            best = ("edge", edge, (edge.src, it), at)
    return best


def _critical_path(inp: ScheduleInput, nodes: dict, lo: float, last: int) -> dict[str, float]:
    """Seconds per task / edge / offload on the path that bounds the window [lo, hi]."""
    out: dict[str, float] = {}

    def add(name: str, a: float, b: float) -> None:
        a = max(a, lo)
        if b > a:
            out[name] = out.get(name, 0.0) + (b - a)

    # An iteration ends with its last task; the weight sync it sends belongs to the next one.
    cursor: tuple | None = None
    best = -math.inf
    for task in inp.tasks:
        n = nodes[(task, last)]
        if n.end > best:
            best, cursor = n.end, ("node", (task, last), n.end)
    guard = 0
    while cursor is not None and cursor[-1] > lo and guard < 10_000:
        guard += 1
        if cursor[0] in ("weights", "edge"):
            _, edge, src_key, at = cursor
            src = nodes[src_key]
            begin = src.end if cursor[0] != "edge" else min(src.out[-1], at)
            add(edge.name, begin, at)
            cursor = ("node", src_key, begin)
            continue
        _, key, until = cursor
        node = nodes[key]
        until = min(until, node.end)
        if node.tail_by is not None and node.tail_by[3] < until:
            seg_start, nxt = node.tail_by[3], node.tail_by
        else:
            seg_start, nxt = node.start, node.start_by
        comp_end = node.out[-1]
        add(f"offload:{node.task}", max(seg_start, comp_end), until)
        add(node.task, max(seg_start, node.compute_start), min(until, comp_end))
        add(f"offload:{node.task}", seg_start, min(until, node.compute_start))
        if nxt[0] == "none":
            break
        if nxt[0] == "group":
            prev = nodes[nxt[1]]
            cursor = ("node", nxt[1], prev.end)
        else:
            cursor = nxt
    return out


def _timeline(inp: ScheduleInput, nodes: dict, weight_ready: dict, window: tuple[float, float],
              last: int) -> tuple[Event, ...]:
    lo, hi = window
    events: list[Event] = []

    def add(name: str, devices: tuple[str, ...], a: float, b: float, kind: str, group: int) -> None:
        a, b = max(a, lo), min(b, hi)
        if b > a:
            events.append(Event(name, devices, a - lo, b - lo, kind, group))

    def label(task: str, it: int) -> str:
        return task if it == last else f"{task} (step {it - last:+d})"

    for (task, it), node in nodes.items():
        if node.end <= lo or node.start >= hi:
            continue
        g = inp.group_of[task]
        devs = inp.task_devices.get(task, ())
        add(f"reload:{label(task, it)}", devs, node.start, node.compute_start, "offload", g)
        add(label(task, it), devs, node.compute_start, node.out[-1], "compute", g)
        add(f"offload:{label(task, it)}", devs, node.out[-1], node.end, "offload", g)
        for edge, _seconds in inp.forward:
            if edge.dst == task and inp.group_of[edge.src] != g and edge.name in node.arrivals:
                src, arrival = nodes[(edge.src, it)], node.arrivals[edge.name]
                begin = src.out[-1] if arrival[0] == arrival[-1] else src.out[0]
                add(f"{edge.kind}:{edge.src}->{task}", devs, begin, arrival[-1], "transfer", g)
    for edge, seconds in inp.weights:
        for (name, it), ready in weight_ready.items():
            if name == edge.name:
                g = inp.group_of[edge.dst]
                name = f"weights:{edge.src}->{edge.dst}" + ("" if it == last else f" (step {it - last:+d})")
                add(name, inp.task_devices.get(edge.dst, ()),
                    ready - seconds, ready, "weights", g)
    events.sort(key=lambda e: (e.group, e.start))
    return tuple(events)
