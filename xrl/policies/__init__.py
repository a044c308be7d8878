"""Policies shipped with xrl: `default.pt` (see default.json for how it was trained and how it scores)."""
