"""The docs a newcomer reads stay short, linked and complete.

README.md fits in 300 lines; every relative link in README.md and docs/*.md reaches an existing file
(and, for a Markdown file, an existing heading); no file cites a design document that is not in the
repository; every script in experiments/ has an entry in experiments/README.md.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
MAX_README_LINES = 300

# [text](target): inline Markdown links; images and reference-style links are not used in these docs
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)


def github_anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation other than - and _ dropped, spaces to -."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Anchors of a Markdown file's headings (repeated headings get GitHub's -1, -2 suffixes)."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            base = github_anchor(m.group(1))
            n = seen.get(base, 0)
            out.add(base if n == 0 else f"{base}-{n}")
            seen[base] = n + 1
    return out


def relative_links(path: Path) -> list[str]:
    text = FENCE.sub("", path.read_text())  # a link-like string inside a code block is not a link
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_readme_is_short():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; at most {MAX_README_LINES}"


def test_github_anchor_matches_github():
    assert github_anchor("Measured truth: the machine decides") == "measured-truth-the-machine-decides"
    assert github_anchor("What onnxruntime runs (target `ort-cpu`)") == "what-onnxruntime-runs-target-ort-cpu"
    assert github_anchor("Dependencies, and why each is there") == "dependencies-and-why-each-is-there"


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    broken = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{doc.relative_to(ROOT)}: broken links: {broken}"


def test_link_checker_sees_a_broken_link(tmp_path: Path):
    doc = tmp_path / "a.md"
    doc.write_text("# Title\n\n[ok](#title) [bad](missing.md) [bad anchor](#nowhere)\n```\n[skip](gone.md)\n```\n")
    assert relative_links(doc) == ["#title", "missing.md", "#nowhere"]
    assert anchors(doc) == {"title"}


def test_no_file_cites_design_md():
    # git grep: the tracked and untracked files of the checkout, not .venv or build outputs
    name = "DESIGN" + ".md"  # spelled apart so this file does not cite it
    found = subprocess.run(["git", "grep", "-l", "--untracked", "-F", name], cwd=ROOT,
                           capture_output=True, text=True)
    assert found.returncode in (0, 1), found.stderr
    assert found.stdout.split() == [], f"files cite {name}, which is not in the repository: {found.stdout.split()}"


def test_every_experiment_has_an_entry():
    entries = (ROOT / "experiments" / "README.md").read_text()
    missing = [p.name for p in sorted((ROOT / "experiments").glob("*.py")) if f"`{p.name}`" not in entries]
    assert not missing, f"experiments/README.md has no entry for: {missing}"
