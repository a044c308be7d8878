"""Explicit Pad folded into the op after it: what it is worth under onnxruntime on real exported CNNs.

Two torch models with TensorFlow-style "same" padding (static nn.ZeroPad2d / F.pad before the op, as
TF ports such as timm's tf_efficientnet write it), exported by torch's TorchScript exporter at 1x3x224x224:

- effnet_b0_same: EfficientNet-B0 layout (MBConv blocks, depthwise 3x3/5x5, squeeze-excite, SiLU) with a zero
  Pad before every 3x3/5x5 conv. onnxruntime folds these Pads into the Convs itself (PadFusion).
- resnet18_same: ResNet-18 with a zero Pad before the 7x7 stem and every 3x3 conv, and a -inf Pad before the
  3x3 stride-2 MaxPool, which onnxruntime leaves as a Pad.
- resnet50_keras: ResNet-50 laid out as keras.applications has it: a zero Pad before the stem conv, and a zero
  Pad between the stem's Relu and the MaxPool, which onnxruntime leaves (xrl folds it: the Relu makes zero as
  good as -inf).

Each model is Pad-folded with xrl's `fold_pad_*` rules only (applied until none matches), checked against the
original under onnxruntime, and timed: onnxruntime, ORT_ENABLE_ALL, one thread; three models (the original,
the original again as an A/A control, the folded model) run in alternating rounds, the order rotated and the
sessions made afresh each round.
The median over rounds of the ratio of each round's median times gives the speed-up, with a 95% bootstrap
interval; the A/A ratio shows the noise. Both the wall time
and the CPU time of the calling thread are taken: with one intra-op thread onnxruntime computes on the caller's
thread, so its CPU time is not inflated when other processes take the core away (a loaded shared machine);
cache and memory-bandwidth contention still show in it.

    .venv/bin/python experiments/bench_pad_fold.py [--models effnet_b0_same,resnet18_same,resnet50_keras] [--rounds 10]
        [--runs 10] [--out experiments/results/pad_fold_cpu.md]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import tempfile
import time
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import torch
import torch.nn.functional as F
from torch import nn

from xrl.frontends.onnx_io import from_onnx, to_onnx
from xrl.ir import Graph
from xrl.rewrite import RewriteEngine, load_rules


# ----- the models ----------------------------------------------------------------------------------
def same_pads(size: int, k: int, s: int) -> tuple[int, int]:
    """TensorFlow's SAME padding of one axis: (before, after), the odd one after."""
    out = -(-size // s)
    total = max((out - 1) * s + k - size, 0)
    return total // 2, total - total // 2


class SamePad(nn.Module):
    """A static TF-style SAME pad for a k x k window with stride s on a size x size input."""

    def __init__(self, size: int, k: int, s: int, value: float = 0.0) -> None:
        super().__init__()
        lo, hi = same_pads(size, k, s)
        self.pads, self.value = (lo, hi, lo, hi), value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, self.pads, value=self.value)


def conv_same(cin: int, cout: int, k: int, s: int, size: int, groups: int = 1) -> nn.Sequential:
    pad = [SamePad(size, k, s)] if k > 1 else []
    return nn.Sequential(*pad, nn.Conv2d(cin, cout, k, s, groups=groups, bias=False), nn.BatchNorm2d(cout))


class MBConv(nn.Module):
    def __init__(self, cin: int, cout: int, expand: int, k: int, s: int, size: int) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = nn.Sequential(conv_same(cin, mid, 1, 1, size), nn.SiLU()) if expand != 1 else nn.Identity()
        self.dw = nn.Sequential(conv_same(mid, mid, k, s, size, groups=mid), nn.SiLU())
        se = max(1, cin // 4)
        self.se = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(mid, se, 1), nn.SiLU(), nn.Conv2d(se, mid, 1),
                                nn.Sigmoid())
        self.project = conv_same(mid, cout, 1, 1, -(-size // s))
        self.residual = s == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.dw(self.expand(x))
        y = self.project(y * self.se(y))
        return x + y if self.residual else y


class EffNetB0Same(nn.Module):
    # (expand, kernel, stride, out channels, repeats): EfficientNet-B0
    STAGES = ((1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3), (6, 5, 1, 112, 3),
              (6, 5, 2, 192, 4), (6, 3, 1, 320, 1))

    def __init__(self, size: int = 224) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_same(3, 32, 3, 2, size), nn.SiLU()]
        size, cin = -(-size // 2), 32
        for e, k, s, cout, n in self.STAGES:
            for i in range(n):
                stride = s if i == 0 else 1
                layers.append(MBConv(cin, cout, e, k, stride, size))
                size, cin = -(-size // stride), cout
        layers += [conv_same(cin, 1280, 1, 1, size), nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                   nn.Linear(1280, 1000)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, s: int, size: int) -> None:
        super().__init__()
        self.a = nn.Sequential(conv_same(cin, cout, 3, s, size), nn.ReLU())
        self.b = conv_same(cout, cout, 3, 1, -(-size // s))
        self.down = conv_same(cin, cout, 1, s, size) if s != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.b(self.a(x)) + self.down(x))


class ResNet18Same(nn.Module):
    def __init__(self, size: int = 224) -> None:
        super().__init__()
        layers: list[nn.Module] = [conv_same(3, 64, 7, 2, size), nn.ReLU()]
        size = -(-size // 2)
        layers += [SamePad(size, 3, 2, value=float("-inf")), nn.MaxPool2d(3, 2)]
        size, cin = -(-size // 2), 64
        for cout, s in ((64, 1), (128, 2), (256, 2), (512, 2)):
            for i in range(2):
                stride = s if i == 0 else 1
                layers.append(BasicBlock(cin, cout, stride, size))
                size, cin = -(-size // stride), cout
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, 1000)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Bottleneck(nn.Module):
    def __init__(self, cin: int, mid: int, s: int) -> None:
        super().__init__()
        cout = 4 * mid
        self.body = nn.Sequential(nn.Conv2d(cin, mid, 1, s, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                                  nn.Conv2d(mid, mid, 3, 1, 1, bias=False), nn.BatchNorm2d(mid), nn.ReLU(),
                                  nn.Conv2d(mid, cout, 1, bias=False), nn.BatchNorm2d(cout))
        self.down = (nn.Sequential(nn.Conv2d(cin, cout, 1, s, bias=False), nn.BatchNorm2d(cout))
                     if s != 1 or cin != cout else nn.Identity())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.down(x))


class ResNet50Keras(nn.Module):
    """keras.applications.ResNet50's layout: ZeroPadding2D(3), a valid 7x7 stem, Relu, ZeroPadding2D(1), a valid
    3x3 MaxPool, then bottlenecks (strided 1x1 convs, as Keras has them)."""

    def __init__(self, size: int = 224) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.ZeroPad2d(3), nn.Conv2d(3, 64, 7, 2, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                   nn.ZeroPad2d(1), nn.MaxPool2d(3, 2)]
        cin = 64
        for mid, n, s in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(n):
                layers.append(Bottleneck(cin, mid, s if i == 0 else 1))
                cin = 4 * mid
        layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


MODELS = {"effnet_b0_same": EffNetB0Same, "resnet18_same": ResNet18Same, "resnet50_keras": ResNet50Keras}


def export(name: str, size: int = 224) -> onnx.ModelProto:
    torch.manual_seed(0)
    net = MODELS[name](size).eval()
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, torch.randn(1, 3, size, size), buf, dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["y"])
    return onnx.load_from_string(buf.getvalue())


# ----- folding, checking, timing -------------------------------------------------------------------
def fold_pads(g: Graph) -> tuple[Graph, Counter]:
    """Apply xrl's fold_pad_* rules until none matches; the count of each rule applied."""
    engine = RewriteEngine([r for r in load_rules() if r.name.startswith("fold_pad_")])
    used: Counter = Counter()
    while True:
        cands = engine.candidates(g)
        if not cands:
            return g, used
        used[cands[0].rule] += 1
        g = cands[0].graph.validate()


def session(model: onnx.ModelProto, *, threads: int = 1, optimized_path: str | None = None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    if optimized_path:
        so.optimized_model_filepath = optimized_path
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def ort_ops(model: onnx.ModelProto) -> Counter:
    """The op histogram of the model onnxruntime runs after its own optimisations."""
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "opt.onnx")
        session(model, optimized_path=path)
        return Counter(n.op_type for n in onnx.load(path).graph.node)


def interleaved(models: dict[str, onnx.ModelProto], feeds: dict[str, np.ndarray], rounds: int, runs: int,
                warmup: int = 2) -> dict[str, dict[str, np.ndarray]]:
    """Per clock ("wall", "cpu": this thread's CPU time), round and model, the median of `runs` timed calls
    (seconds). The order of the models rotates each round, and each round runs fresh sessions: two sessions of
    one model can differ by several percent for the whole of their lives (where their buffers landed), which
    alternating rounds alone would not average out."""
    names = list(models)
    out: dict[str, dict[str, list[float]]] = {c: {n: [] for n in names} for c in ("wall", "cpu")}
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        sessions = {n: session(models[n]) for n in order}
        for s in sessions.values():
            for _ in range(warmup):
                s.run(None, feeds)
        for n in order:
            wall, cpu = [], []
            for _ in range(runs):
                t0, c0 = time.perf_counter(), time.thread_time()
                sessions[n].run(None, feeds)
                cpu.append(time.thread_time() - c0)
                wall.append(time.perf_counter() - t0)
            out["wall"][n].append(float(np.median(wall)))
            out["cpu"][n].append(float(np.median(cpu)))
    return {c: {n: np.array(v) for n, v in d.items()} for c, d in out.items()}


def ratio_summary(before: np.ndarray, after: np.ndarray) -> tuple[float, float, float]:
    """The median over rounds of before/after (> 1: `after` is faster) and its 95% bootstrap interval."""
    r = before / after
    boot = np.median(np.random.default_rng(0).choice(r, size=(2000, len(r))), axis=1)
    return float(np.median(r)), float(np.quantile(boot, 0.025)), float(np.quantile(boot, 0.975))


def bench(name: str, rounds: int, runs: int, size: int) -> dict[str, object]:
    model = export(name, size)
    g = from_onnx(model)
    folded_graph, used = fold_pads(g)
    folded = to_onnx(folded_graph)
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32)}
    ref = session(model).run(None, feeds)[0]
    got = session(folded).run(None, feeds)[0]
    err = float(np.max(np.abs(ref - got)))
    assert np.allclose(ref, got, rtol=1e-4, atol=1e-4), f"{name}: folded model differs by {err}"
    times = interleaved({"A": model, "A2": model, "B": folded}, feeds, rounds, runs)
    ops_in = Counter(n.op for n in g.nodes.values())
    ops_out = Counter(n.op for n in folded_graph.nodes.values())
    return {
        "model": name, "pads": ops_in["Pad"], "pads_after_ort": ort_ops(model)["Pad"], "folded": sum(used.values()),
        "rules": ", ".join(f"{k} x{v}" for k, v in sorted(used.items())), "pads_left": ops_out["Pad"],
        "pads_left_after_ort": ort_ops(folded)["Pad"], "max_abs_err": err,
        **{f"{c}_{k}": v for c, t in times.items() for k, v in (
            ("orig_ms", 1e3 * float(np.median(t["A"]))), ("folded_ms", 1e3 * float(np.median(t["B"]))),
            ("speedup", ratio_summary(t["A"], t["B"])), ("aa", ratio_summary(t["A"], t["A2"])))},
    }


def table(rows: list[dict[str, object]]) -> str:
    head = ("| model | clock | Pads | Pads ORT leaves | folded by xrl | Pads ORT leaves after folding | original (ms) "
            "| folded (ms) | speed-up (median over rounds [95% interval]) | A/A (median [95% interval]) |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        for c in ("cpu", "wall"):
            s, aa = r[f"{c}_speedup"], r[f"{c}_aa"]
            lines.append(f"| {r['model']} | {c} | {r['pads']} | {r['pads_after_ort']} | {r['folded']} | "
                         f"{r['pads_left_after_ort']} | {r[f'{c}_orig_ms']:.2f} | {r[f'{c}_folded_ms']:.2f} | "
                         f"{s[0]:.3f} [{s[1]:.3f}, {s[2]:.3f}] | {aa[0]:.3f} [{aa[1]:.3f}, {aa[2]:.3f}] |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = [bench(m, args.rounds, args.runs, args.size) for m in args.models.split(",")]
    text = "\n".join([
        f"onnxruntime {ort.__version__}, ORT_ENABLE_ALL, 1 thread; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores; {args.rounds} alternating rounds x {args.runs} runs, 1x3x{args.size}x{args.size}",
        "",
        table(rows),
        "",
        *(f"- {r['model']}: {r['rules']}; max abs error vs original {r['max_abs_err']:.2g}" for r in rows),
    ])
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
