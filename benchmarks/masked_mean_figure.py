"""The masked-mean lesson as numbers and a figure: one padded batch, three ways to average.

    python benchmarks/masked_mean_figure.py        # table, and docs/images/masked_mean.png
    python benchmarks/masked_mean_figure.py --out /tmp/mm.png
    python benchmarks/masked_mean_figure.py --out mm.png --json mm.json   # the table as JSON

The batch: 16 completions of one prompt, 2 long chains of thought (512 tokens, both wrong)
and 14 short answers (24-64 tokens, seeded; 7 right). Rewards 1/0, advantages
`A = r - mean r` (one group, Dr. GRPO's estimator). The per-token loss is the policy
gradient surrogate at ratio 1, `-A_b * exp(logp - sg[logp])`: its value is `-A_b` and its
gradient with respect to each log-prob is `-A_b` times the weight the reduction gives that
token. The batch is padded to a width from the longest completion (512) to 8x that, and the
same per-token losses are reduced three ways:

- token-mean (right): `rlvr.algo.aggregate_token_mean`, the masked sum over the masked-token
  count; run as 4 micro-batches of 4 rows with the step's count as divisor (`num_tokens`), as
  rlvr's update does, it is the same number;
- padded-width mean (wrong): `rlvr.train.loss_checks.aggregate_padded_width_mean`, the masked
  sum over rows x padded width;
- per-micro-batch mean (wrong): `rlvr.train.loss_checks.aggregate_micro_batch_mean` summed
  over the 4 micro-batches (each its own token mean, times 4/16): gradient accumulation with
  `loss / accumulation_steps`. The rows are in length order (the two long ones share the first
  micro-batch), as a length-sorted packer puts them.

Printed: the loss, the gradient's relative error `||g - g*|| / ||g*||` against the right
reduction's gradient `g*`, and the weight of a long completion's token relative to a short
one's. Written: two panels, loss and gradient error against the padded width. Deterministic:
no sampling beyond one seeded generator, matplotlib's Agg backend, no timestamp in the file.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from rlvr import algo
from rlvr.train.loss_checks import aggregate_micro_batch_mean, aggregate_padded_width_mean

LONG, SHORT = 2, 14  # completions
LONG_TOKENS = 512
MICRO_BATCH_ROWS = 4
FACTORS = (1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 8.0)  # padded width / longest completion


def batch(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(lengths [16], advantages [16]) of the lesson's batch, long completions first."""
    gen = torch.Generator().manual_seed(seed)
    short = torch.randint(24, 65, (SHORT,), generator=gen)
    lengths = torch.cat([torch.full((LONG,), LONG_TOKENS), short.sort(descending=True).values])
    rewards = torch.tensor([0.0] * LONG + [1.0, 0.0] * (SHORT // 2), dtype=torch.float64)
    return lengths, algo.advantages_dr_grpo(rewards, torch.zeros(len(rewards), dtype=torch.long))


def reduce_three_ways(
    lengths: torch.Tensor, advantages: torch.Tensor, width: int
) -> dict[str, tuple[float, torch.Tensor]]:
    """(loss, gradient [rows, width] with respect to the log-probs) of each reduction, the
    batch padded to `width` columns."""
    rows = len(lengths)
    mask = (torch.arange(width) < lengths[:, None]).double()
    parts = torch.arange(rows).split(MICRO_BATCH_ROWS)
    tokens = mask.sum().item()

    def run(reduce) -> tuple[float, torch.Tensor]:
        logp = torch.zeros(rows, width, dtype=torch.float64, requires_grad=True)
        per_token = -advantages[:, None] * torch.exp(logp - logp.detach())  # value -A, ratio 1
        loss = reduce(per_token, mask)
        (grad,) = torch.autograd.grad(loss, logp)
        return loss.item(), grad

    def token_mean_by_micro_batch(per_token, mask):
        return sum(
            algo.aggregate_token_mean(per_token[p], mask[p], num_tokens=tokens) for p in parts
        )

    def micro_batch_mean(per_token, mask):
        return sum(aggregate_micro_batch_mean(per_token[p], mask[p], num_seqs=rows) for p in parts)

    return {
        "token-mean": run(algo.aggregate_token_mean),
        "token-mean, 4 micro-batches": run(token_mean_by_micro_batch),
        "padded-width mean": run(aggregate_padded_width_mean),
        "per-micro-batch mean": run(micro_batch_mean),
    }


def long_to_short_weight(
    grad: torch.Tensor, advantages: torch.Tensor, lengths: torch.Tensor
) -> float:
    """A long completion's token weight over the mean weight of a short completion's token
    outside the first micro-batch (weight = gradient / -A)."""
    weight = grad / -advantages[:, None]
    short_rows = range(MICRO_BATCH_ROWS, len(lengths))
    short = torch.stack([weight[b, : lengths[b]].mean() for b in short_rows]).mean()
    return (weight[0, 0] / short).item()


def table(lengths: torch.Tensor, advantages: torch.Tensor) -> list[dict[str, float]]:
    """One row per padded width: each reduction's loss and gradient error, and the weights."""
    out = []
    for factor in FACTORS:
        width = int(LONG_TOKENS * factor)
        runs = reduce_three_ways(lengths, advantages, width)
        right = runs["token-mean"][1]
        row = {"width": width}
        for name, (loss, grad) in runs.items():
            row[f"loss {name}"] = loss
            row[f"grad error {name}"] = ((grad - right).norm() / right.norm()).item()
            row[f"long/short {name}"] = long_to_short_weight(grad, advantages, lengths)
        out.append(row)
    return out


def print_table(rows: list[dict[str, float]]) -> None:
    names = (
        "token-mean",
        "token-mean, 4 micro-batches",
        "padded-width mean",
        "per-micro-batch mean",
    )
    print("| padded width | " + " | ".join(f"loss: {n}" for n in names) + " |")
    print("|---:" * (len(names) + 1) + "|")
    for row in rows:
        cells = " | ".join(f"{row[f'loss {n}']:.4f}" for n in names)
        print(f"| {row['width']} | {cells} |")
    print()
    print("| padded width | " + " | ".join(f"||g - g*|| / ||g*||: {n}" for n in names[1:]) + " |")
    print("|---:" * len(names) + "|")
    for row in rows:
        cells = " | ".join(f"{row[f'grad error {n}']:.3f}" for n in names[1:])
        print(f"| {row['width']} | {cells} |")
    print()
    first = rows[0]
    print(
        "weight of a long completion's token / a short one's (any width): "
        + ", ".join(f"{n} {first[f'long/short {n}']:.3f}" for n in names)
    )


# short names of the reductions in the --json file (keys a dotted path can name)
JSON_KEYS = {
    "token-mean": "token_mean",
    "token-mean, 4 micro-batches": "token_mean_micro_batches",
    "padded-width mean": "padded_width_mean",
    "per-micro-batch mean": "micro_batch_mean",
}


def json_report(
    lengths: torch.Tensor, advantages: torch.Tensor, rows: list[dict[str, float]]
) -> dict:
    """The printed numbers as a dict: the batch, then per padded width (rows, in FACTORS
    order) each reduction's loss, gradient error and long/short token weight, and the
    weights of the first width (they do not depend on it)."""
    out_rows = []
    for factor, row in zip(FACTORS, rows):
        entry = {"width": row["width"], "factor": factor}
        for field, prefix in (
            ("loss", "loss"),
            ("grad_error", "grad error"),
            ("long_short_weight", "long/short"),
        ):
            entry[field] = {key: row[f"{prefix} {name}"] for name, key in JSON_KEYS.items()}
        out_rows.append(entry)
    return {
        "lengths": lengths.tolist(),
        "advantages": advantages.tolist(),
        "micro_batch_rows": MICRO_BATCH_ROWS,
        "rows": out_rows,
        "long_short_weight": out_rows[0]["long_short_weight"],
    }


def plot(rows: list[dict[str, float]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    widths = [row["width"] for row in rows]
    styles = {
        "token-mean": ("tab:green", "-", "token-mean (right; 1 pass = 4 micro-batches)"),
        "padded-width mean": ("tab:red", "--", "padded-width mean (/ rows x width)"),
        "per-micro-batch mean": ("tab:orange", ":", "per-micro-batch mean (/ its own tokens)"),
    }
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    for name, (color, style, label) in styles.items():
        left.plot(
            widths, [r[f"loss {name}"] for r in rows], style, color=color, marker="o", label=label
        )
        right.plot(
            widths,
            [r[f"grad error {name}"] for r in rows],
            style,
            color=color,
            marker="o",
            label=label,
        )
    left.set(
        xlabel="padded width (tokens; longest completion 512)",
        ylabel="loss",
        title="loss of the same batch",
    )
    right.set(
        xlabel="padded width (tokens; longest completion 512)",
        ylabel="||g - g*|| / ||g*||",
        title="gradient error against token-mean",
    )
    left.axhline(0.0, color="grey", linewidth=0.5)
    left.legend(fontsize=8)
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.suptitle(
        "2 long (512-token) and 14 short (24-64-token) completions, padded wider and wider",
        fontsize=10,
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("docs/images/masked_mean.png"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json",
        type=Path,
        metavar="PATH",
        help="also write the printed numbers as a JSON dict (rows.<i>.loss.<reduction>, "
        "rows.<i>.grad_error.<reduction>, long_short_weight.<reduction>)",
    )
    args = parser.parse_args()
    lengths, advantages = batch(args.seed)
    print(f"lengths {lengths.tolist()}")
    print(f"advantages {[round(a, 4) for a in advantages.tolist()]}\n")
    rows = table(lengths, advantages)
    print_table(rows)
    plot(rows, args.out)
    print(f"\nwrote {args.out}")
    if args.json:
        import json

        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(json_report(lengths, advantages, rows), indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
