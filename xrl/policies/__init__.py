"""Policies shipped with xrl, each with a .json saying how it was trained and how it scores: `expert.pt`
(expert iteration on ort-cpu's measured kernel costs: ort-cpu's default) and `default.pt` (PPO under the
analytic cost model: every other target's). `xrl.rl.policy_files.TARGET_POLICIES` maps targets to them."""
