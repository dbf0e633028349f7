"""Levels 3-5 of HetRL's search for one arm: an evolutionary search over concrete placements.

An arm fixes the task grouping and how many GPUs of each kind each group gets. A genome fills in
the rest: per group an ordered device list (which concrete GPUs — hosts, regions — and, through
the order, which tasklet sits on which GPU) plus each task's TP×PP. Mutations are the moves
HetRL names: swapping GPUs of one kind across groups (alone or a host's worth at once, which
moves a group between hosts or regions), swapping GPUs across tasklets inside a group,
changing a task's parallel shape, and giving a group's tasks one shape together. Layer splits
and batch shares follow from the genome by balancing (`search.layouts`), so evolution never
wastes evaluations on unbalanced variants.

The state is plain data and every random choice comes from the arm's own seeded generator, so
an arm advanced in a worker process gives the same result as in the parent.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from hetprof.planner.search.arms import Arm
from hetprof.planner.search.seeding import initial_orders
from hetprof.planner.search.space import Assembler, ShapeChoice
from hetprof.specs.vocabulary import TASK_KIND, Task, TaskKind

if TYPE_CHECKING:
    from collections.abc import Mapping

    from hetprof.planner.candidate import Candidate
    from hetprof.planner.search.base import Ledger
    from hetprof.planner.search.space import Grouping
    from hetprof.specs import Device

POPULATION = 6
TOURNAMENT = 2
SEED_VARIANTS = 4   # locality-ordered starting placements per arm before evolution takes over
MAX_MISSES = 60     # consecutive already-seen children after which an arm counts as exhausted


@dataclasses.dataclass(frozen=True)
class Genome:
    """Levels 3-5: device order per group (the last entry holds the idle GPUs) and TP×PP per task."""

    orders: tuple[tuple[str, ...], ...]
    shapes: tuple[tuple[str, ShapeChoice], ...]

    def shape_map(self) -> dict[str, ShapeChoice]:
        return dict(self.shapes)


class ArmEvolution:
    """One arm's population; `advance(n, evaluate)` spends n evaluations on it."""

    def __init__(self, arm: Arm, index: int, seed: int, assembler: Assembler,
                 by_type: dict[str, tuple[str, ...]]) -> None:
        self.arm = arm
        self.index = index
        self.rng = np.random.default_rng([seed, index])
        self.assembler = assembler
        self.by_type = by_type
        self.population: list[tuple[float, Genome]] = []
        self.seen: set[Genome] = set()
        self.evaluations = 0
        self.variant = 0
        self.best_value = math.inf
        self.best_candidate: Candidate | None = None
        self.exhausted = False
        self.pending: list[Genome] = []     # reshapes of a new best (`coherent_neighbours`), tried next, in order
        self.pending_from: Genome | None = None     # a new best whose neighbours are listed when next needed

    # ---- genomes --------------------------------------------------------------------------------
    def _repair(self, orders: tuple[tuple[str, ...], ...], shapes: dict[str, ShapeChoice] | None,
                touched: set[int], greedy: bool) -> Genome | None:
        new = dict(shapes or {})
        for g, tasks in enumerate(self.arm.grouping):
            if not orders[g]:
                return None
            for task in tasks:
                allowed = self.assembler.shapes_for(task, orders[g])
                if not allowed:
                    return None
                if task not in new or new[task] not in allowed or (greedy and g in touched):
                    best = self.assembler.best_shape(task, orders[g])
                    if best is None:
                        return None
                    new[task] = best
        return Genome(orders, tuple(sorted(new.items())))

    def seed_genome(self) -> Genome | None:
        devices = self.assembler.planning.devices
        orders = initial_orders(self.arm, self.by_type, self.variant, self.rng, lambda d: devices[d].region)
        self.variant += 1
        return self._repair(orders, None, set(range(len(orders))), True)

    def mutate(self, genome: Genome) -> Genome | None:
        orders = [list(o) for o in genome.orders]
        shapes = genome.shape_map()
        touched: set[int] = set()
        devs, grouping, rng, allowed = self.assembler.planning.devices, self.arm.grouping, self.rng, self.assembler.shapes_for
        ops: list[Callable[[], bool]] = [lambda: swap_across(orders, touched, False, devs, rng),
                                         lambda: swap_across(orders, touched, True, devs, rng),
                                         lambda: swap_tasklets(orders, touched, grouping, rng),
                                         lambda: reshape(orders, shapes, grouping, allowed, rng),
                                         lambda: cohere(orders, shapes, grouping, allowed, rng)]
        moves = 1 + int(self.rng.integers(0, 2))
        done = 0
        for _ in range(8 * moves):
            if ops[int(self.rng.integers(0, len(ops)))]():
                done += 1
                if done == moves:
                    break
        if not done:
            return None
        greedy = bool(self.rng.random() < 0.5)
        return self._repair(tuple(tuple(o) for o in orders), shapes, touched, greedy)

    def coherent_neighbours(self, genome: Genome) -> list[Genome]:
        """The reshapes tried after a new best, in turns: group-wide (`group_reshapes`) and one
        task alone (`task_reshapes`); each list likeliest first, replaced at the next new best."""
        seen: set[Genome] = set()
        return _alternate(self.group_reshapes(genome, seen), self.task_reshapes(genome, seen))

    def group_reshapes(self, genome: Genome, seen: set[Genome]) -> list[Genome]:
        """Every group-coherent reshape of a genome not in `seen` (which it extends): per shared group
        and common shape, the group's tasks (all, or all but generation) set to it; the moves alone
        are too rare to chain.

        Listed likeliest first: by the reshaped tasks' own seconds summed (`_own_seconds`;
        colocated tasks run one after another), then in shape order. A good reshape can sit
        anywhere in shape order.
        """
        ranked: list[tuple[float, int, Genome]] = []
        for g, tasks in enumerate(self.arm.grouping):
            rest = [t for t in tasks if TASK_KIND[Task(t)] != TaskKind.GENERATION]
            for names in [tuple(tasks)] + ([tuple(rest)] if len(rest) < len(tasks) else []):
                if len(names) < 2:
                    continue
                common = set.intersection(*(set(self.assembler.shapes_for(t, genome.orders[g])) for t in names))
                for shape in sorted(common):
                    shapes = genome.shape_map()
                    shapes.update((t, shape) for t in names)
                    child = Genome(genome.orders, tuple(sorted(shapes.items())))
                    if child != genome and child not in self.seen and child not in seen:
                        seen.add(child)
                        ranked.append((self._own_seconds(names, genome.orders[g], shape), len(ranked), child))
        ranked.sort(key=lambda r: (r[0], r[1]))
        return [child for _, _, child in ranked]

    def task_reshapes(self, genome: Genome, seen: set[Genome]) -> list[Genome]:
        """Per task, the genome with that task alone on its fastest other shape by own seconds (not
        in `seen`, which it extends), best first by the ratio to the task's current own seconds.

        A random reshape reaches one given task's shape once in tasks × shapes moves: the training
        shapes the long searches settled on waited about a thousand evaluations for it."""
        out: list[tuple[float, int, Genome]] = []
        current = genome.shape_map()
        for g, tasks in enumerate(self.arm.grouping):
            for task in tasks:
                now = self._own_seconds((task,), genome.orders[g], current[task])
                options = [s for s in self.assembler.shapes_for(task, genome.orders[g]) if s != current[task]]
                if not options:
                    continue
                secs, shape = min((self._own_seconds((task,), genome.orders[g], s), s) for s in options)
                child = Genome(genome.orders, tuple(sorted({**current, task: shape}.items())))
                if math.isfinite(secs) and child not in self.seen and child not in seen:
                    seen.add(child)
                    out.append((secs / now if math.isfinite(now) and now > 0 else 0.0, len(out), child))
        out.sort(key=lambda r: (r[0], r[1]))
        return [child for _, _, child in out]

    def _own_seconds(self, tasks: Sequence[str], order: Sequence[str], shape: ShapeChoice) -> float:
        """The tasks' own seconds summed at `shape` on the group's devices (inf where one has no
        layout or overflows memory alone): a cheap, memoised guess at what the reshape scores."""
        total = 0.0
        for task in tasks:
            total += self.assembler.own_seconds(task, tuple(order), shape)
            if total == math.inf:
                break
        return total

    # ---- search ---------------------------------------------------------------------------------
    def candidate(self, genome: Genome) -> Candidate | None:
        return self.assembler.assemble(self.arm.grouping, genome.orders, genome.shape_map())

    def _insert(self, value: float, genome: Genome) -> None:
        self.population.append((value, genome))
        self.population.sort(key=lambda vg: vg[0])
        del self.population[POPULATION:]

    def _parent(self) -> Genome:
        picks = self.rng.choice(len(self.population), size=min(TOURNAMENT, len(self.population)), replace=False)
        return self.population[int(min(picks))][1]

    def advance(self, n: int, evaluate: Callable[[Candidate], float], stop: Callable[[], bool]) -> None:
        """Spend up to n evaluations: seed variants first, then children of tournament winners.

        An arm whose neighbourhood yields only genomes already seen (small arms run out) is
        marked exhausted and costs nothing more.
        """
        spent = 0
        misses = 0
        while spent < n and not self.exhausted and not stop():
            if self.pending_from is not None:   # listed only when the arm goes on: ranking builds layouts
                self.pending, self.pending_from = self.coherent_neighbours(self.pending_from), None
            if self.pending:
                genome = self.pending.pop(0)
            elif self.variant < SEED_VARIANTS and len(self.population) < 2:
                genome = self.seed_genome()
            elif self.population:
                genome = self.mutate(self._parent())
            else:
                genome = None
            if genome is None or genome in self.seen:
                misses += 1
                if misses >= MAX_MISSES or (not self.population and self.variant >= SEED_VARIANTS):
                    self.exhausted = True
                continue
            misses = 0
            self.seen.add(genome)
            cand = self.candidate(genome)
            value = math.inf if cand is None else evaluate(cand)
            spent += 1
            self.evaluations += 1
            if value < self.best_value and cand is not None:
                self.best_value, self.best_candidate = value, cand
                self.pending, self.pending_from = [], genome
            self._insert(value, genome)

    @property
    def value(self) -> float:
        return self.best_value

    def adopt(self, genome: Genome, ledger: Ledger) -> None:
        """Score a genome once and add it to the population (a new best if it is one)."""
        if genome in self.seen:
            return
        self.seen.add(genome)
        built = self.candidate(genome)
        value = math.inf if built is None else ledger.evaluate(built)[0]
        if built is not None and value < self.best_value:
            self.best_value, self.best_candidate = value, built
        self._insert(value, genome)

    def seed_from(self, cands: Sequence[Candidate], ledger: Ledger, all_devices: Sequence[str]) -> None:
        """Start the population from known candidates (the MILP's solutions for this arm).

        The candidate itself is scored as given (its type-pure replicas may differ from what the
        genome rebuilds), and its genome joins the population for evolution to improve on.
        """
        for cand in cands:
            value = ledger.evaluate(cand)[0]
            if value < self.best_value:
                self.best_value, self.best_candidate = value, cand
            self.adopt(genome_from_candidate(cand, all_devices), ledger)


# ---- the mutation moves: each edits a genome's orders or shapes in place, True if it changed them ----
# (module functions of the arm's own generator, so a move draws the same numbers wherever it runs)
Allowed = Callable[[str, Sequence[str]], Sequence[ShapeChoice]]   # a task's TP×PP choices on a group's devices


def swap_across(orders: list[list[str]], touched: set[int], block: bool, devs: Mapping[str, Device],
                rng: np.random.Generator) -> bool:
    """Swap GPUs of one kind between two groups (the idle pool counts as a group)."""
    holders: dict[str, list[int]] = {}
    for g, o in enumerate(orders):
        for t in sorted({devs[d].type for d in o}):
            holders.setdefault(t, []).append(g)
    types = [t for t in sorted(holders) if len(holders[t]) >= 2]
    if not types:
        return False
    t = types[int(rng.integers(0, len(types)))]
    ga, gb = (int(x) for x in rng.choice(holders[t], size=2, replace=False))
    a_idx = [i for i, d in enumerate(orders[ga]) if devs[d].type == t]
    b_idx = [i for i, d in enumerate(orders[gb]) if devs[d].type == t]
    ia = a_idx[int(rng.integers(0, len(a_idx)))]
    ib = b_idx[int(rng.integers(0, len(b_idx)))]
    if block:
        ha, hb = devs[orders[ga][ia]].host, devs[orders[gb][ib]].host
        if ha == hb:
            return False
        a_idx = [i for i in a_idx if devs[orders[ga][i]].host == ha]
        b_idx = [i for i in b_idx if devs[orders[gb][i]].host == hb]
        pairs = list(zip(a_idx, b_idx, strict=False))
    else:
        pairs = [(ia, ib)]
    for i, j in pairs:
        orders[ga][i], orders[gb][j] = orders[gb][j], orders[ga][i]
    touched.update((ga, gb))
    return True


def swap_tasklets(orders: list[list[str]], touched: set[int], grouping: Grouping, rng: np.random.Generator) -> bool:
    """Swap two GPUs inside a group: they trade tasklets (replica, stage) for every task."""
    k = len(grouping)
    groups = [g for g in range(k) if len(orders[g]) >= 2]
    if not groups:
        return False
    g = groups[int(rng.integers(0, len(groups)))]
    i, j = (int(x) for x in rng.choice(len(orders[g]), size=2, replace=False))
    orders[g][i], orders[g][j] = orders[g][j], orders[g][i]
    return True


def reshape(orders: list[list[str]], shapes: dict[str, ShapeChoice], grouping: Grouping, allowed: Allowed,
            rng: np.random.Generator) -> bool:
    """Give one task another TP×PP its group's devices allow."""
    tasks = [(g, t) for g, ts in enumerate(grouping) for t in ts]
    g, task = tasks[int(rng.integers(0, len(tasks)))]
    others = [s for s in allowed(task, orders[g]) if s != shapes.get(task)]
    if not others:
        return False
    shapes[task] = others[int(rng.integers(0, len(others)))]
    return True


def cohere(orders: list[list[str]], shapes: dict[str, ShapeChoice], grouping: Grouping, allowed: Allowed,
           rng: np.random.Generator) -> bool:
    """Give every task of one group the same TP×PP (generation may keep its own).

    Shapes picked one task at a time can each be fastest alone yet together overflow the
    shared GPUs' memory; a group-wide shape is several coordinated reshapes in one move.
    """
    groups = [g for g, ts in enumerate(grouping) if len(ts) >= 2]
    if not groups:
        return False
    g = groups[int(rng.integers(0, len(groups)))]
    tasks = list(grouping[g])
    keep_generation = bool(rng.random() < 0.5)
    if keep_generation:
        tasks = [t for t in tasks if TASK_KIND[Task(t)] != TaskKind.GENERATION] or tasks
    return set_common_shape(tasks, shapes, lambda t: allowed(t, orders[g]), rng)


def _alternate(first: list[Genome], second: list[Genome]) -> list[Genome]:
    """The two lists taken in turns, each in its own order (a group-wide and a one-task reshape)."""
    out: list[Genome] = []
    for i in range(max(len(first), len(second))):
        out += first[i:i + 1] + second[i:i + 1]
    return out


def set_common_shape(tasks: Sequence[str], shapes: dict[str, ShapeChoice],
                     allowed: Callable[[str], Sequence[ShapeChoice]], rng: np.random.Generator) -> bool:
    """Set `tasks` to one shape all of them allow, other than a shape they already all share."""
    common = set(allowed(tasks[0]))
    for task in tasks[1:]:
        common &= set(allowed(task))
    choices = sorted(s for s in common if any(shapes.get(t) != s for t in tasks))
    if not choices:
        return False
    pick = choices[int(rng.integers(0, len(choices)))]
    for task in tasks:
        shapes[task] = pick
    return True


def genome_from_candidate(candidate: Candidate, all_devices: Sequence[str]) -> Genome:
    """A known candidate as a genome: each group's order follows its first task's tasklets."""
    orders = []
    used: set[str] = set()
    for tasks, devs in zip(candidate.groups, candidate.group_devices, strict=True):
        lay = candidate.layout(tasks[0])
        first = [d for r in lay.replicas for d in r]
        order = tuple(first + [d for d in devs if d not in first])
        orders.append(order)
        used.update(order)
    orders.append(tuple(d for d in all_devices if d not in used))
    shapes = tuple(sorted((t, (lay.tp, lay.pp)) for t, lay in candidate.layouts))
    return Genome(tuple(orders), shapes)


def rank_arms(states: Sequence[ArmEvolution], keep: int) -> list[ArmEvolution]:
    """Successive halving's cut: the `keep` best arms by best value found (ties by arm index)."""
    return sorted(states, key=lambda s: (s.value, s.index))[:keep]
