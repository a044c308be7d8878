"""Issue 34 item 4: every option of `xrl.api.optimize` is checked at its entry, before any model is loaded, and
each wrong one is one ConfigError line (not a raw TypeError minutes later, nor silently accepted).

The model named is a file that does not exist: an option that got past the check would meet a ModelLoadError
instead, so each case also proves that nothing was loaded first."""

from __future__ import annotations

import math
import time
from pathlib import Path

import pytest

from xrl import api
from xrl.errors import ConfigError, ModelLoadError

MISSING = "no-such-dir/no-such-model.onnx"

BAD = [  # (option, value, words the message must hold)
    ("output", 123, "output takes a path"),
    ("output", "out.txt", "must end in .onnx"),
    ("search", 7, "search takes a string"),
    ("search", "nosuch", "unknown search method 'nosuch'; choose one of"),
    ("cost", "nosuch", "unknown cost model"),
    ("device", 3, "device takes a string"),
    ("target", "nosuch", "unknown target"),
    ("prepass", "o", "unknown pre-pass 'o'"),
    ("prepass", 5, "prepass takes a sequence"),
    ("prepass", ["onnxslim", 3], "pre-pass names"),
    ("seed", "abc", "seed takes a whole number"),
    ("seed", -1, "at least 0"),
    ("seed", 1.5, "seed takes a whole number"),
    ("seed", True, "seed takes a whole number"),
    ("steps", -5, "steps takes a whole number of at least 0"),
    ("steps", "ten", "steps takes"),
    ("time_limit", "fast", "time_limit takes a number"),
    ("time_limit", math.nan, "time_limit takes a number"),
    ("time_limit", -1.0, "time_limit takes a number above 0"),
    ("time_limit", 0, "time_limit takes a number above 0"),
    ("time_limit", -math.inf, "time_limit"),
    ("input_shapes", {"x": "1,3"}, "input_shapes['x']"),
    ("input_shapes", {"x": (1, 0)}, "positive whole numbers"),
    ("input_shapes", [("x", (1,))], "input_shapes takes a dict"),
    ("force", "yes", "force takes True or False"),
    ("verify_trials", 0, "verify_trials takes a whole number of at least 1"),
    ("verify_trials", -3, "verify_trials"),
    ("verify_trials", 2.0, "verify_trials"),
    ("search_options", ["screen_top"], "search_options takes a dict"),
    ("search_options", {"nosuch": 1}, "search_options has no option 'nosuch' for search 'greedy'"),
    ("search_options", {"screen_top": "x"}, "search_options['screen_top']"),
    ("cost_options", 5, "cost_options takes a dict"),
    ("cost_options", {"nosuch": 1}, "cost_options has no option 'nosuch'"),
    ("cost_options", {1: 2}, "not a string"),
    ("measure", "fast", "unknown measurement engine"),
    ("measure_options", {"repeats": "x"}, "measure_options['repeats']"),
    ("measure_options", {"repeats": 0}, "at least 1"),
    ("measure_options", {"nosuch": 1}, "measure_options has no option 'nosuch'"),
    ("measure_rounds", 0, "measure_rounds takes a whole number of at least 1"),
    ("measure_rounds", math.inf, "measure_rounds"),
    ("guard", "on", "guard takes True or False"),
    ("guard_options", {"nosuch": 1}, "guard_options has no option 'nosuch'"),
    ("guard_options", {"rounds": -1}, "guard_options['rounds']"),
    ("guard_options", {"budget_s": math.nan}, "guard_options['budget_s']"),
    ("guard_options", {"rounds": 8, "max_rounds": 4}, "below its rounds"),
    ("threads", 0, "threads takes a whole number of at least 1"),
    ("threads", "all", "threads"),
]


@pytest.mark.parametrize("option,value,words", BAD, ids=[f"{o}={v!r}" for o, v, _ in BAD])
def test_every_wrong_option_is_one_config_error_line_before_the_model_is_loaded(option, value, words):
    t0 = time.perf_counter()
    with pytest.raises(ConfigError) as e:
        api.optimize(MISSING, **{option: value})
    message = str(e.value)
    assert words in message and "\n" not in message, message
    assert time.perf_counter() - t0 < 2.0


def test_cost_options_are_checked_against_the_cost_model_they_configure():
    with pytest.raises(ConfigError, match=r"cost_options\['repeats'\]"):
        api.optimize(MISSING, cost="ort", cost_options={"repeats": "x"})
    with pytest.raises(ConfigError, match="no option 'repeats' for cost model 'roofline'"):
        api.optimize(MISSING, cost="roofline", cost_options={"repeats": 3})


GOOD = [("prepass", "onnxslim"), ("prepass", "onnxslim,ort-transformers"), ("prepass", "none"), ("prepass", ()),
        ("time_limit", math.inf), ("time_limit", 5), ("steps", 0), ("seed", 2**40), ("threads", None),
        ("output", Path("x.onnx")), ("guard_options", {"rounds": 3, "max_rounds": 9, "budget_s": 10.0}),
        ("measure_options", {"repeats": 3, "warmup": 0, "threads": None}), ("search_options", {"screen_top": 4}),
        ("cost_options", {"repeats": 3}), ("verify_trials", 1), ("measure", "ort")]


@pytest.mark.parametrize("option,value", GOOD, ids=[f"{o}={v!r}" for o, v in GOOD])
def test_valid_options_pass_the_check_and_reach_the_load(option, value):
    options = {option: value}
    if option == "cost_options":
        options["cost"] = "ort"
    with pytest.raises(ModelLoadError):  # got past every check: the model is read (and is missing)
        api.optimize(MISSING, **options)


def test_a_prepass_string_means_the_pass_it_names():
    from xrl.options import check_optimize_options

    assert check_optimize_options({"prepass": "onnxslim"}) == ("onnxslim",)
    assert check_optimize_options({"prepass": "onnxslim, ort-transformers"}) == ("onnxslim", "ort-transformers")
    assert check_optimize_options({"prepass": "none"}) == ()
    assert check_optimize_options({"prepass": None}) is None


@pytest.mark.parametrize("flag,value,words", [("--time-limit", "nan", "time_limit"), ("--seed", "-1", "seed"),
                                              ("--steps", "-5", "steps"), ("--time-limit", "-3", "time_limit")])
def test_the_cli_checks_its_numbers_before_reading_the_model(capsys, flag: str, value: str, words: str):
    from cli_helpers import assert_user_error, run

    code, _, err = run(capsys, "optimize", MISSING, f"{flag}={value}")
    assert_user_error(code, err, words)
    assert "no such file" not in err
