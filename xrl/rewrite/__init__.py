"""The rewrite engine: rules as data (`rewrite_rules/*.rules`), verified numerically, applied as
cheap deltas on an immutable Graph.

    rules = load_rules()                     # the verified built-in rules
    engine = RewriteEngine(rules)            # or RewriteEngine.default(): the same rules
    for cand in engine.candidates(graph):    # every distinct rewrite of graph
        cand.rule, cand.location, cand.removed, cand.added, cand.graph

Modules: `lang` (the rule language), `expr` (its expressions), `attrs` (attribute defaults),
`match` (pattern matching) and `search` (the Searcher: a rule set's matches), `apply` (the Applier:
a match -> a rewrite), `candidate` (Candidate: a rewrite as a delta, its graph and new weights built
on demand), `engine` (the orchestrator: matches -> distinct candidates), `instantiate` + `verify`
(numerical checks), `rules` (loading; new rules go in `rewrite_rules/*.rules`).
"""

from xrl.rewrite.candidate import Candidate, CandidateInfo
from xrl.rewrite.engine import RewriteEngine
from xrl.rewrite.lang import Rule, RuleInfo, RuleSyntaxError, parse_file, parse_rules
from xrl.rewrite.rules import RuleSet, load_rules, parse_rule_files, rules_dir
from xrl.rewrite.verify import RuleCheck, verify_rule, verify_rules

__all__ = [
    "Candidate", "CandidateInfo", "RewriteEngine", "Rule", "RuleCheck", "RuleInfo", "RuleSet", "RuleSyntaxError",
    "load_rules", "parse_file", "parse_rule_files", "parse_rules", "rules_dir", "verify_rule", "verify_rules",
]
