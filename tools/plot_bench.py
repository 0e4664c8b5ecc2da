"""Charts for BENCHMARKS.md from the CSV files of `attn-bench --device cuda --csv FILE` and
`tools/torch_peer.py --csv FILE` (columns impl,kind,batch,context,us,value,unit).

    python3 tools/plot_bench.py OUT_DIR attn-bench.csv [torch-peer.csv ...]

writes OUT_DIR/decode.png (GB/s against context, one panel per batch size, every
implementation as a line, the device read ceiling of the attn-bench run drawn across) and
OUT_DIR/prefill.png (TFLOP/s per case and implementation, the bf16 matmul ceiling drawn
across). Needs matplotlib (pip install matplotlib); nothing else of the repository does.
"""
import csv
import os
import sys
from collections import defaultdict


LABELS = {"attn.h": "attn.h (C API, paged)", "attn_h": "attn.h via attn_h.py (paged)",
          "default": "PyTorch SDPA default", "flash": "PyTorch SDPA flash", "cudnn": "PyTorch SDPA cuDNN"}


def label(impl):
    return LABELS.get(impl, impl)


def load(paths):
    rows = []
    for p in paths:
        with open(p) as f:
            rows += [r for r in csv.DictReader(f)]
    return rows


def main(argv):
    if len(argv) < 3:
        print(__doc__)
        return 2
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir, rows = argv[1], load(argv[2:])
    os.makedirs(out_dir, exist_ok=True)
    read = max((float(r["value"]) for r in rows if r["kind"] == "ceiling_read"), default=0.0)
    mm = max((float(r["value"]) for r in rows if r["kind"] == "ceiling_matmul"), default=0.0)

    dec = defaultdict(dict)  # (impl, batch) -> {context: GB/s}
    for r in rows:
        if r["kind"] == "decode":
            dec[(r["impl"], int(r["batch"]))][int(r["context"])] = float(r["value"])
    batches = sorted({b for _, b in dec})
    impls = sorted({i for i, _ in dec}, key=lambda i: (i != "attn.h", i))
    if batches:
        fig, axes = plt.subplots(1, len(batches), figsize=(4.2 * len(batches), 3.8), sharey=True)
        axes = axes if len(batches) > 1 else [axes]
        for ax, b in zip(axes, batches):
            for impl in impls:
                pts = sorted(dec.get((impl, b), {}).items())
                if pts:
                    ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o",
                            linewidth=2.5 if impl == "attn.h" else 1.2, label=label(impl))
            if read:
                ax.axhline(read, color="k", linestyle="--", linewidth=1, label=f"read ceiling {read:.0f}")
            ax.set_xscale("log", base=2)
            ax.set_title(f"decode, batch {b}")
            ax.set_xlabel("context (tokens)")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("GB/s (K+V bytes / time)")
        axes[-1].legend(fontsize=8, loc="lower right")
        fig.suptitle("Paged decode, 32/8 heads, head 128, bf16, block 16 (PyTorch: contiguous K/V)")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "decode.png"), dpi=110)
        print(os.path.join(out_dir, "decode.png"))

    pre = defaultdict(dict)  # case -> {impl: TFLOP/s}
    for r in rows:
        if r["kind"] == "prefill":
            pre[f"{r['batch']} x {r['context']}"][r["impl"]] = float(r["value"])
    if pre:
        cases = sorted(pre)
        pimpls = sorted({i for c in pre.values() for i in c}, key=lambda i: (i != "attn.h", i))
        fig, ax = plt.subplots(figsize=(7, 4))
        w = 0.8 / len(pimpls)
        for j, impl in enumerate(pimpls):
            ax.bar([i + j * w for i in range(len(cases))], [pre[c].get(impl, 0) for c in cases], w, label=label(impl))
        if mm:
            ax.axhline(mm, color="k", linestyle="--", linewidth=1, label=f"bf16 matmul {mm:.0f}")
        ax.set_xticks([i + 0.4 - w / 2 for i in range(len(cases))])
        ax.set_xticklabels([f"causal {c}" for c in cases])
        ax.set_ylabel("TFLOP/s (causal-useful pairs)")
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        fig.suptitle("Causal prefill, 32/8 heads, head 128, bf16")
        fig.tight_layout()
        fig.savefig(os.path.join(out_dir, "prefill.png"), dpi=110)
        print(os.path.join(out_dir, "prefill.png"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
