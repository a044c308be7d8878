"""Prior-guided search: a beam over a prior's choices, ranked by its value, under a time budget.

The argmax rollout reads one action per state; this search reads the policy as AlphaGo-style
searches do, as a prior over which rewrites are worth trying and a value for how much a state has
left to give:

    beam <- {input graph}
    repeat for each depth while the beam is not empty and time is left:
        for each state s in the beam: its `expand` most likely rewrites under pi(. | s)
        children, deduplicated by canonical hash (two orders of commuting rewrites are one graph),
        pruned to cost < alpha * the parent's cost (a step uphill is allowed, a climb is not),
        scored  achieved(s') + w V(s')       achieved: the reward collected so far, 100 * (c0 - c) / c0
                                             w: value_weight; V in percent of c0 (below)
        beam <- the `width` best scored children
    stop when `patience` depths pass without the beam finding a state cheaper than it had found
    then again, twice as wide and trying twice as many rewrites per state, while the budget lasts;
    once a pass sees no more states than the one before (the space under the prior's top choices
    is exhausted), the next ones allow steeper climbs: alpha's margin doubles (1.1, 1.2, 1.4, ...)
    return the cheapest graph seen, the argmax rollout's included

Rule-first descents (with an incumbent, as `--search rl` runs by default: after greedy, before the argmax
rollout, which mostly retraces greedy's descent; without one the search is the prior's alone, as the
ablations compare it): greedy's first steps can close off a better
sequence when another rule's steps are worth nearly as much at first. On nasrnn (target paper) merging three
MatMuls that share an input is worth 0.46% a step and fusing a MatMul and its Add into a Gemm 0.43%: greedy
merges, after which no Add can fuse, and stops at 1.140x; fusing every Add first and then descending greedily
reaches 1.667x. A beam ranked by achieved cost drops the fusing paths, each step a little behind. So for up
to RESTARTS rules among the input's candidates, in the order of the prior's likeliest candidate of each rule
(then those a candidate cap hid from the prior, in the engine's order)
(the rule the incumbent began with left out: its descent is greedy's), the search descends
greedily applying only that rule, then with every rule, offering each state it passes.

The argmax rollout runs first, so the search never returns worse than argmax; the children of a
depth are encoded in one batched forward pass. With a prior that has learned which uphill rewrite
pays off (an enlargement before a merge) the beam follows it where greedy and a cost-ranked beam
drop it. Relaxing alpha only once the space is exhausted matters on small graphs whose best sequence
climbs steeply first: merging a decoding-step LoRA adapter, x A B -> x (A B), turns two thin GEMVs into
a full one (about 1.5x the cost of the graph) before x W + x (A B) = x (W + A B) removes it; large graphs
spend their budget widening at the first alpha. Deterministic where the budget does not bind: no
sampling, ties go to the engine's candidate order.

The prior (xrl.rl.priors) is a trained policy, the same network untrained, a uniform prior or a cost
prior: the same search reads each the same way, so what learning adds is measured at equal budget. A
non-learned prior has no argmax rollout worth running (uniform) or one that is greedy by estimate (cost).

Stopping (`stop=True`, what `--search rl` runs): besides the budget and the exhausted space, the search
stops (1) when a pass found nothing new and the value head bounds what is left below the best found:
no state the pass scored has achieved(s) + V(s) above the best's achieved reward; (2) when it has spent
EARN times the time it took to find its best (at least EARN_FLOOR_S): time goes on while it pays, so on
a graph where nothing beyond the argmax rollout is found the search takes about EARN times the rollout's
time, not its whole budget. `stop=False` runs to the budget (the ablations' anytime curves).

The value head (issue 32.3). V(s) is the prior's estimate of the gain left from s, in percent of the input's cost
c0: a PPO critic's value is in those units ("start"); a head regressed on the reference sequences' remaining gain
(experiments/fit_value_head.py, xrl/policies/research.pt) is in percent of s's own cost and reads s as an
episode's start ("state"; PolicyConfig.value_unit), so the search multiplies it by c(s) / c0. `value_weight` w
ranks the beam (0: by the cost reached alone). `value_stop` t (None: off) stops on the value head: a state with
V(s) <= t is not expanded (its branch ends), and the search ends after a pass that found nothing new and left no
state open above t: every state it valued above t it expanded with every rewrite (none cut by the width, by
`expand` or by alpha). With V ~ 0 everywhere the search ends after the argmax rollout; with V high it ends once
the states under the prior's choices are exhausted instead of repeating them at steeper alphas. Priors without a
value head (cost, uniform) ignore both.

An `incumbent` (a result found before the search, such as greedy's: what `--search rl` passes with its
defaults) starts the best, with the clock's start `t0` at the incumbent's own start: with the stop rule the
search earns ANCHOR_EARN times the incumbent's time (and EARN times the time to any later find), so where
nothing beyond greedy exists the whole run takes about ANCHOR_EARN times greedy's time, and it never returns
less than the incumbent.

States come back: the argmax rollout walks greedy's path where it agrees with greedy, and every widening pass
starts again from the input graph. `MemoEngine` remembers the candidates of the states it enumerated (by graph
object: a child state is its parent candidate's graph, so a revisited state is the same object), and the
feature cache remembers each candidate's region by candidate object, so a revisited state costs neither an
enumeration nor a featurisation; `_score` remembers the prior's judgement of a state at a depth.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from xrl.cost.base import CostModel
from xrl.env.graph_rewrite import rule_name
from xrl.ir import Graph
from xrl.rl.evaluate import PolicyRun, make_env
from xrl.rl.priors import Judgement, PolicyPrior, Prior
from xrl.rl.rollout import uphill_paid_off

# Defaults: a beam of 4 states, each trying its 4 likeliest rewrites; 10% uphill per step (as beam search).
WIDTH, EXPAND, ALPHA = 4, 4, 1.1
# Depths without a new best before a pass stops: the beam wanders uphill for at most this long.
PATIENCE = 8
SCORE_BATCH = 8  # states per forward pass when scoring children (the clock is read between batches)
MAX_EXPAND = 32  # widening doubles the rewrites tried per state up to this
MAX_ALPHA = 8.0  # relaxing stops here: a climb to 8x the parent's cost is not a step on any useful path
# The stop rule's earned time: the search goes on for at most EARN times as long as it took to find its
# best (the rollout's end counts as a find), and always for EARN_FLOOR_S: small graphs' alpha relaxations
# (lora_decode's climb) take a fraction of a second and are found after several passes with no new best.
EARN, EARN_FLOOR_S = 2.0, 1.0
# After an incumbent (greedy's result, with `--search rl`'s defaults), until the search finds better: the run
# takes at most this many times the incumbent's time (issue 24's goal: 2x greedy's time where nothing is left;
# the margin is for the last step or scoring batch, which may end past the earned time).
ANCHOR_EARN = 1.5
RESTARTS = 4  # rule-first descents tried after the rollout
# The beam's ranking, achieved + VALUE_WEIGHT * V, and the value head's stop threshold (None: off); defaults chosen
# on the research suite's validation split (docs/results.md)
VALUE_WEIGHT, VALUE_STOP = 1.0, None
MEMO_STATES = 512  # states whose candidates MemoEngine keeps (least recently used out)
# A new best must be cheaper by this fraction: the same graph costed along another path is not a find.
MIN_GAIN = 1e-9


class MemoEngine:
    """A RewriteEngine that remembers the candidates of the last `capacity` graphs it enumerated, by graph
    object (an entry holds its graph, so an id is not reused while it lives). A list cut short by a search's
    deadline is not kept. Everything else is the wrapped engine's."""

    def __init__(self, engine: Any, capacity: int = MEMO_STATES) -> None:
        self.engine, self.capacity = engine, capacity
        self._memo: OrderedDict[tuple[int, int | None], tuple[Graph, list]] = OrderedDict()
        self.hits = self.misses = 0

    def __getattr__(self, name: str) -> Any:  # rules, max_growth, ...: the engine's
        return getattr(self.__dict__["engine"], name)

    def candidates(self, graph: Graph, *, original_nodes: int | None = None) -> list:
        key = (id(graph), original_nodes)
        hit = self._memo.get(key)
        if hit is not None and hit[0] is graph:
            self._memo.move_to_end(key)
            self.hits += 1
            return list(hit[1])
        self.misses += 1
        before = getattr(self.engine, "timed_out", 0)
        cands = self.engine.candidates(graph, original_nodes=original_nodes)
        if getattr(self.engine, "timed_out", 0) == before and self.capacity > 0:
            self._memo[key] = (graph, cands)
            if len(self._memo) > self.capacity:
                self._memo.popitem(last=False)
        return list(cands)


def memo_engine(engine: Any = None) -> MemoEngine:
    """`engine` (None: one over the verified built-in rules) wrapped in a MemoEngine, unless it is one."""
    if isinstance(engine, MemoEngine):
        return engine
    if engine is None:
        from xrl.rewrite import RewriteEngine

        engine = RewriteEngine.default()
    return MemoEngine(engine)


@dataclass
class _Node:
    env: Any  # a GraphRewriteEnv forked at this state
    steps: list[str]
    costs: list[float]  # the cost at every state of the path, the input's first
    score: float = 0.0  # the beam's ranking: achieved + value_weight * value
    judged: Judgement | None = None  # the prior's view of this state
    value: float = 0.0  # the prior's value of this state in percent of the input's cost (its unit rescaled)

    def achieved_plus_value(self, c0: float) -> float:
        """What the state's path would reach by the value head: the stop rule's bound."""
        return 100.0 * (c0 - self.env.cost) / c0 + self.value


@dataclass
class _Clock:
    """The budget's deadline and, with the stop rule, the earned time."""

    t0: float
    deadline: float
    earn: float | None  # None: run to the deadline
    last_find: float = 0.0  # now() of the last new best
    factor: float | None = None  # what the last find earns: `earn`, or ANCHOR_EARN for an incumbent
    now: Callable[[], float] = time.perf_counter  # the budget's clock (expert iteration: CPU seconds)
    spent: Callable[[], bool] | None = None  # a cost-call budget's (xrl.search.budget): True once it is used up

    def over(self) -> bool:
        if self.spent is not None and self.spent():
            return True  # past its calls the model answers +inf: nothing more can be found
        now = self.now()
        if now >= self.deadline:
            return True
        if self.earn is None:
            return False
        factor = self.earn if self.factor is None else self.factor
        return now - self.t0 > max(EARN_FLOOR_S, factor * (self.last_find - self.t0))


@dataclass
class _Best:
    cost: float
    graph: Graph
    steps: list[str]
    uphill: bool
    c0: float
    clock: _Clock
    trace: list[tuple[float, float]] = field(default_factory=list)  # (seconds, best cost) at each new best

    def offer(self, cost: float, graph: Graph, steps: list[str], costs: list[float]) -> None:
        if cost < self.cost * (1 - MIN_GAIN):
            self.cost, self.graph, self.steps, self.uphill = cost, graph, steps, uphill_paid_off(costs)
            self.found()

    def found(self, at: float | None = None) -> None:
        self.clock.last_find = now = self.clock.now() if at is None else at
        self.clock.factor = None
        self.trace.append((now - self.clock.t0, self.cost))

    @property
    def achieved(self) -> float:
        return 100.0 * (self.c0 - self.cost) / self.c0


def as_prior(prior: Prior | Any) -> Prior:
    """A Prior as it is; a GraphPolicy as the trained prior it is."""
    return prior if isinstance(prior, Prior) else PolicyPrior(prior)


def guided_search(prior: Prior | Any, graph: Graph, cost_model: CostModel, *, engine: Any = None,
                  horizon: int = 50, width: int = WIDTH, expand: int = EXPAND, alpha: float = ALPHA,
                  patience: int = PATIENCE, max_alpha: float = MAX_ALPHA, time_limit: float | None = None,
                  max_candidates: int | None = None, stop: bool = False,
                  trace: list[tuple[float, float]] | None = None,
                  incumbent: tuple[Graph, float, list[str]] | None = None, t0: float | None = None,
                  restarts: int = RESTARTS, timer: Callable[[], float] = time.perf_counter,
                  value_weight: float = VALUE_WEIGHT, value_stop: float | None = VALUE_STOP,
                  expanded: list[list[str]] | None = None, action: str = "flat",
                  top_rules: int | None = None) -> PolicyRun:
    """The cheapest graph the prior's argmax rollout or the prior-guided beam reached within `time_limit`
    seconds of `t0` (default: now) (`prior`: an xrl.rl.priors.Prior, or a GraphPolicy for the trained prior).
    With `stop`, the search also ends where it stops paying (the module's doc). `incumbent` (graph, cost,
    steps), found before the call (since `t0`), is the best to beat: the result is never worse, and the
    earned time counts from the incumbent's find, now. `restarts`: the rule-first descents to try after an
    incumbent (0: none).
    `trace`, if given, receives (seconds, best cost) at the
    start and at every new best: the anytime curve. `timer` is the budget's clock (`t0` is read on it):
    wall time by default; expert iteration passes `time.process_time` so that the expert's effort per
    search does not shrink when other jobs share the machine.
    `value_weight`: the beam ranks a state by achieved + value_weight * V (0: by the cost reached alone);
    `value_stop` (None: off): a state whose V is at most this (percent of the input's cost) is not expanded,
    and the search ends after a pass that found nothing new and left no state above it unexpanded (the
    module's doc). Both read a prior's value head; priors without one (cost, uniform) ignore them.
    `expanded`, if given, receives the path (steps) of every state the beam expands, in order.
    `action`: "flat" (every rewrite of a state is built and offered to the prior) or "factored" (xrl.rl.factored:
    the rules that match are scored first and only the `top_rules` best rules' rewrites are built, scored by the
    rule-level cost prior: the rule head, untrained, adds nothing and is not run)."""
    if width < 1 or expand < 1:
        raise ValueError(f"width and expand must be at least 1, not {width} and {expand}")
    if not value_weight >= 0 or (value_stop is not None and not value_stop >= 0):
        raise ValueError(f"value_weight and value_stop must be >= 0, not {value_weight} and {value_stop}")
    prior = as_prior(prior)
    called = timer()  # an incumbent was found by now: setting up below spends the earned time
    t0 = called if t0 is None else t0
    spent = cost_model.budget_exhausted  # declared on CostModel (False); a CallBudget copy answers its own
    clock = _Clock(t0, t0 + time_limit if time_limit is not None else float("inf"), EARN if stop else None, t0,
                   now=timer, spent=spent)
    # one engine (its rules parsed and verified once) for the argmax rollout and the beam, remembering states
    if action not in ("flat", "factored"):
        raise ValueError(f"action must be flat or factored, not {action!r}")
    if action == "factored":
        from xrl.rl.factored import TOP_RULES, FactoredEngine

        raw = unwrapped(engine) if engine is not None else memo_engine(None).engine
        engine = FactoredEngine(raw, cost_model, top=top_rules or TOP_RULES)
    engine = memo_engine(engine)
    env = make_env(graph, cost_model, engine=engine, horizon=horizon, max_candidates=max_candidates)
    env.reset(options={"graph": graph})
    c0 = env.cost0
    best = _Best(c0, graph, [], False, c0, clock)
    best.trace.append((0.0, c0))
    if incumbent is not None:
        inc_graph, inc_cost, inc_steps = incumbent
        if inc_cost < best.cost * (1 - MIN_GAIN):
            best.cost, best.graph, best.steps = inc_cost, inc_graph, list(inc_steps)
            best.found(called)
        clock.last_find = called  # the incumbent's find (an equal one is a find too)
        clock.factor = ANCHOR_EARN
    judged: dict[tuple[int, int], tuple[Graph, Judgement]] = {}  # (graph id, depth) -> the prior's judgement
    env_steps, rollout_speedups = 0, []
    skip = {s.split("@")[0] for s in (incumbent[2][:1] if incumbent is not None else [])}
    if incumbent is not None:  # the rollout mostly retraces greedy's descent: other rules' descents first
        env_steps += _rule_first(env, c0, prior, cost_model, engine, best, clock, judged, skip, restarts)
    if prior.rolls_out:
        # After an incumbent the rollout is on the stop rule's clock too; alone it runs to the budget, as the
        # passes earn their time from its end
        roll_clock = clock if incumbent is not None else _Clock(t0, clock.deadline, None, t0, now=timer, spent=spent)
        first = _argmax_rollout(prior, graph, cost_model, engine, horizon, max_candidates, roll_clock, best)
        env_steps, rollout_speedups = first.env_steps, [first.speedup]
        if incumbent is None:
            clock.last_find = timer()  # the rollout's end: the passes earn time from here
    states, last, passes = 0, 0, []
    # Widening: one beam pass, then passes twice as wide and deep in the prior, while the budget lasts.
    # A pass that explored no more states than the last one has seen the whole space reachable under
    # the prior's top choices at this alpha: the next passes may climb more steeply.
    while not clock.over() and (width, expand, alpha) not in passes:
        passes.append((width, expand, alpha))
        before = best.cost
        explored, bound, left_open = _beam_pass(env, c0, prior, best, width=width, expand=expand, alpha=alpha,
                                                patience=patience, clock=clock, judged=judged,
                                                value_weight=value_weight, value_stop=value_stop, expanded=expanded)
        env_steps += explored
        states += explored
        if stop and prior.has_value and best.cost >= before and bound <= best.achieved:
            break  # nothing new, and the value head expects nothing above the best from anything it saw
        if value_stop is not None and prior.has_value and best.cost >= before and not left_open:
            break  # nothing new, and every state left open is worth at most value_stop by the value head
        if len(passes) > 1 and explored <= last:
            if alpha >= max_alpha:
                break
            alpha = min(max_alpha, 1 + max(2 * (alpha - 1), 0.1))
        last = explored
        width, expand = width * 2, min(expand * 2, MAX_EXPAND)
    if trace is not None:
        trace.extend(best.trace)
    return PolicyRun(best.graph, best.cost, c0, best.steps, 1 + states, env_steps, timer() - t0,
                     best.uphill, [*rollout_speedups, c0 / best.cost])


def _argmax_rollout(prior: Prior, graph: Graph, cost_model: CostModel, engine: Any, horizon: int,
                    max_candidates: int | None, clock: _Clock, best: _Best) -> PolicyRun:
    """The prior's argmax from the input until it picks the no-op (a policy's: what `--rl-mode argmax` plays,
    lowest index on ties), or the clock says stop (its budget, or with the stop rule its earned time). Each
    cheaper state is offered to `best` as it is reached (the anytime curve counts it then, not when the
    rollout ends); steps are `rule@location`, as the beam's, so a searched path can be replayed."""
    t0 = clock.now()
    env = make_env(graph, cost_model, engine=engine, horizon=horizon, max_candidates=max_candidates)
    env.reset(options={"graph": graph})
    costs, done = [env.cost], False
    while not done and not clock.over():
        action = int(prior.judge([env])[0].log_probs.argmax())
        _, _, terminated, truncated, _ = env.step(action)
        done = terminated or truncated
        costs.append(env.cost)
        best.offer(env.cost, env.graph, list(env.actions), costs)
    return PolicyRun(env.graph, min(costs), env.cost0, list(env.actions), 1, len(costs) - 1,
                     clock.now() - t0, uphill_paid_off(costs))


def _rule_first(env: Any, c0: float, prior: Prior, cost_model: CostModel, engine: Any, best: _Best, clock: _Clock,
                judged: dict, skip: set[str], restarts: int = RESTARTS) -> int:
    """Rule-first descents from the input graph (the module's doc); returns the candidates costed."""
    import torch

    root = _Node(env, [], [c0])
    if restarts < 1 or not _score([root], prior, c0, clock, judged):
        return 0
    lp = root.judged.log_probs[1:]
    rules: list[str] = []
    for a in torch.argsort(-lp, stable=True).tolist():
        name = rule_name(env.candidates[a])
        if torch.isfinite(lp[a]) and name not in rules and name not in skip:
            rules.append(name)
    # then the rules a candidate cap hides from the prior (nasrnn: the cheapest 32 candidates are all merges),
    # in the engine's order
    for cand in env.all_candidates:
        name = rule_name(cand)
        if name not in rules and name not in skip:
            rules.append(name)
    raw = unwrapped(engine)
    by_name = {str(getattr(r, "name", r)): r for r in raw.rules}
    costed = 0
    for name in rules[:restarts]:
        if clock.over() or name not in by_name:
            break
        only = type(raw)([by_name[name]], max_growth=raw.max_growth, max_matches=raw.max_matches)
        path = ([], [c0])
        graph, cost, n = _descend(env.graph, c0, cost_model, only, env.nodes0, clock, best, path)
        _, _, m = _descend(graph, cost, cost_model, engine, env.nodes0, clock, best, path)
        costed += n + m
    return costed


def unwrapped(engine: Any) -> Any:
    """The RewriteEngine under a MemoEngine or a FactoredEngine."""
    while hasattr(engine, "engine"):
        engine = engine.engine
    return engine


def _descend(graph: Graph, cost: float, cost_model: CostModel, engine: Any, nodes0: int, clock: _Clock,
             best: _Best, path: tuple[list[str], list[float]]) -> tuple[Graph, float, int]:
    """Greedy descent under `engine`'s rules from `graph` (cost `cost`) while the clock allows: the cheapest
    improving candidate each step (ties to the engine's order), each state offered to `best`; `path` (steps,
    costs from the input) grows in place. Returns the last graph, its cost and the candidates costed."""
    steps, costs = path
    costed = 0
    while not clock.over():
        top, top_cost = None, cost * (1 - MIN_GAIN)
        for cand in engine.candidates(graph, original_nodes=nodes0):
            costed += 1
            c = cand.delta_cost(cost_model, cost)
            if c < top_cost:
                top, top_cost = cand, c
        if top is None:
            break
        graph, cost = top.graph, top_cost
        steps.append(f"{rule_name(top)}@{','.join(top.location)}")
        costs.append(cost)
        best.offer(cost, graph, list(steps), list(costs))
    return graph, cost, costed


def _beam_pass(env: Any, c0: float, prior: Prior, best: _Best, *, width: int, expand: int, alpha: float,
               patience: int, clock: _Clock, judged: dict | None = None, value_weight: float = VALUE_WEIGHT,
               value_stop: float | None = None, expanded: list[list[str]] | None = None) -> tuple[int, float, bool]:
    """One beam pass from the input graph; updates `best`; returns the number of states it stepped into,
    the highest achieved + value of any state it scored, and whether it left a state open: scored, worth more
    than `value_stop` (any, without it) and not fully expanded (cut by the width, in the beam when the pass ended,
    or with rewrites beyond `expand` untried), or a child too steep for `alpha` (never valued)."""
    root = _Node(env, [], [c0])
    if not _score([root], prior, c0, clock, judged, value_weight):
        return 0, float("-inf"), True  # out of time before the root was judged

    def live(n: _Node) -> bool:  # worth expanding by the value head (value_stop's branch rule)
        return value_stop is None or not prior.has_value or n.value > value_stop

    beam = [root] if live(root) else []
    seen, stale, beam_best, stepped, left_open = {env.graph.canonical_hash}, 0, c0, 0, False
    bound = root.achieved_plus_value(c0)
    while beam and stale < patience and not clock.over():
        children: list[_Node] = []
        improved = False
        for node in beam:
            if expanded is not None:
                expanded.append(list(node.steps))
            actions = _likeliest(node, expand + 1)
            left_open = left_open or len(actions) > expand  # rewrites left untried: the state stays open
            for action in actions[:expand]:
                if clock.over():
                    break
                child = node.env.fork()
                _, _, terminated, truncated, _ = child.step(action)
                stepped += 1
                key = child.graph.canonical_hash
                if key in seen:
                    continue
                if child.cost >= alpha * node.env.cost:
                    left_open = True  # a climb this pass may not take: a later pass's, unvalued
                    continue
                seen.add(key)
                steps, costs = [*node.steps, child.last_rewrite], [*node.costs, child.cost]
                if child.cost < beam_best:
                    beam_best, improved = child.cost, True
                best.offer(child.cost, child.graph, steps, costs)
                if not (terminated or truncated):
                    children.append(_Node(child, steps, costs))
        if children and not clock.over():
            children = _score(children, prior, c0, clock, judged, value_weight)
            bound = max([bound, *(n.achieved_plus_value(c0) for n in children)])
        else:
            children = []  # out of time: nothing scored to expand
        ranked = sorted((n for n in children if live(n)), key=lambda n: -n.score)  # stable: ties keep engine order
        left_open = left_open or len(ranked) > width
        beam = ranked[:width]
        stale = 0 if improved else stale + 1
    return stepped, bound, left_open or bool(beam)


def _likeliest(node: _Node, k: int) -> list[int]:
    """The state's k most likely rewrites (actions 1..n; the no-op is the beam's own stopping)."""
    import torch

    logits = node.judged.log_probs[1:]  # one state: its actions in order, the no-op first
    if logits.numel() == 0:
        return []
    order = torch.argsort(-logits, stable=True)[:k]
    return [int(a) + 1 for a in order if torch.isfinite(logits[a])]


def _score(nodes: list[_Node], prior: Prior, c0: float, clock: _Clock,
           memo: dict[tuple[int, int], tuple[Graph, Judgement]] | None = None,
           value_weight: float = VALUE_WEIGHT) -> list[_Node]:
    """Judge `nodes` in batches of SCORE_BATCH states: each node's distribution, its value V in percent of the
    input's cost `c0` (a "state"-unit value, percent of the state's own cost, times cost / c0) and its score
    achieved + value_weight * V.
    Observing and encoding a wide beam's children of a large graph takes seconds: a batch not started
    before the clock runs out is dropped, so the search ends within about one batch of its budget.
    A state judged before at the same depth (an earlier pass's) takes its judgement from `memo`.
    Returns the scored nodes."""
    memo = {} if memo is None else memo
    scored: list[_Node] = []
    for lo in range(0, len(nodes), SCORE_BATCH):
        if clock.over():
            break
        batch = nodes[lo:lo + SCORE_BATCH]
        keys = [(id(n.env.graph), n.env.step_count) for n in batch]
        fresh = [n for n, k in zip(batch, keys) if k not in memo or memo[k][0] is not n.env.graph]
        for n, judged in zip(fresh, prior.judge([n.env for n in fresh]) if fresh else []):
            memo[(id(n.env.graph), n.env.step_count)] = (n.env.graph, judged)
        for n, k in zip(batch, keys):
            n.judged = memo[k][1]
            n.value = n.judged.value * (n.env.cost / c0 if prior.value_unit == "state" else 1.0)
            n.score = 100.0 * (c0 - n.env.cost) / c0 + value_weight * n.value
        scored.extend(batch)
    return scored


def guided_baselines(policy: Any, graph: Graph, cost_model: CostModel, *, engine: Any = None,
                     horizon: int = 50, max_candidates: int | None = None, time_limit: float = 5.0
                     ) -> dict[str, PolicyRun]:
    """What the policy's argmax is compared with in `xrl eval --baselines`: the same guided search
    (run to `time_limit`) under the cost prior (no learning) and under the policy itself."""
    from xrl.rl.priors import CostPrior

    return {name: guided_search(prior, graph, cost_model, engine=engine, horizon=horizon,
                                max_candidates=max_candidates, time_limit=time_limit)
            for name, prior in (("cost_prior", CostPrior()), ("guided", PolicyPrior(policy)))}


__all__ = ["ALPHA", "ANCHOR_EARN", "EARN", "EARN_FLOOR_S", "EXPAND", "MAX_ALPHA", "MEMO_STATES", "PATIENCE",
           "VALUE_STOP", "VALUE_WEIGHT", "WIDTH",
           "MemoEngine", "RESTARTS", "as_prior", "guided_baselines", "guided_search", "memo_engine"]
