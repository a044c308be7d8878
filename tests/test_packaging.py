"""The Hydra configs ship inside the wheel: every yaml under conf/ (installed as xrl/conf) is matched by
pyproject's package-data.

Fast on purpose (no wheel build): it checks the globs setuptools is given against the files on disk."""

from __future__ import annotations

import tomllib
from pathlib import Path

from xrl.cli.rl_commands import CONF_DIR

ROOT = Path(__file__).resolve().parents[1]


def _setuptools() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as f:
        return tomllib.load(f)["tool"]["setuptools"]


def _package_dir(st: dict, package: str) -> Path:
    return ROOT / st.get("package-dir", {}).get(package, package.replace(".", "/"))


def test_conf_dir_is_inside_the_package():
    assert (CONF_DIR / "train.yaml").is_file()
    assert CONF_DIR == (ROOT / "conf").resolve()
    assert not (ROOT / "xrl" / "conf").exists(), "the configs live in conf/; a stale xrl/conf/ would shadow them"


def test_every_config_yaml_is_package_data():
    st = _setuptools()
    assert "xrl.conf" in st["packages"]
    base = _package_dir(st, "xrl.conf")
    assert base.resolve() == CONF_DIR
    covered: set[Path] = set()
    for pattern in st.get("package-data", {}).get("xrl.conf", []):
        covered |= {p.resolve() for p in base.glob(pattern) if p.is_file()}
    on_disk = {p.resolve() for p in CONF_DIR.rglob("*.yaml")}
    assert on_disk, f"no yaml files under {CONF_DIR}"
    missing = sorted(str(p.relative_to(CONF_DIR)) for p in on_disk - covered)
    assert not missing, f"configs not shipped by [tool.setuptools.package-data] 'xrl.conf': {missing}"
    # every config group train.yaml names is there
    for group in ("env", "model", "algo", "cost", "graphs", "logger", "hydra/launcher", "hydra/sweeper"):
        assert any((CONF_DIR / group).glob("*.yaml")), group


def test_no_yml_files_that_the_globs_would_miss():
    assert not list(CONF_DIR.rglob("*.yml")), "use .yaml: package-data only ships *.yaml"
