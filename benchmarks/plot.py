"""Charts of the gateway scenario: ``python -m benchmarks --plot DIR`` (or, from a
saved run, ``python -m benchmarks.plot FILE.json DIR``).

Two PNGs, one panel per server shell, ours beside the floor and the lock
baseline: ``gateway_events.png`` (events/s delivered against clients, the
offered 20 events/s per client dashed) and ``gateway_p99.png`` (p99 latency
against clients, the 50 ms limit dashed). Needs matplotlib
(``pip install '.[bench]'``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["plot_gateway"]

_STYLE = {
    "ours": ("tab:blue", "o", "ours (duplex-supervisor)"),
    "floor": ("tab:green", "s", "floor (no registry)"),
    "baseline": ("tab:orange", "^", "lock baseline"),
}


def _series(points: Sequence[Mapping[str, object]], mode: str, key: str) -> tuple[list, list]:  # type: ignore[type-arg]
    chosen = sorted(
        (p for p in points if p["mode"] == mode and p[key] is not None),
        key=lambda p: float(p["clients"]),  # type: ignore[arg-type]
    )
    return [p["clients"] for p in chosen], [p[key] for p in chosen]


def plot_gateway(gateway: Mapping[str, object], directory: str | Path) -> list[Path]:
    """Write the charts of ``scenarios.gateway`` (one entry per shell) into ``directory``."""
    import matplotlib  # noqa: PLC0415 - an optional extra

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    shells = [name for name, entry in gateway.items() if isinstance(entry, Mapping)]
    written = []
    for key, label, filename in (
        ("events_per_s", "events/s delivered", "gateway_events.png"),
        ("p99_ms", "p99 latency, engine send to client receive (ms)", "gateway_p99.png"),
    ):
        figure, axes = plt.subplots(
            1, len(shells), figsize=(4.2 * len(shells), 3.6), squeeze=False, sharey=True
        )
        for axis, shell in zip(axes[0], shells, strict=True):
            entry = gateway[shell]
            assert isinstance(entry, Mapping)
            points = entry["points"]
            assert isinstance(points, list)
            for mode, (colour, marker, name) in _STYLE.items():
                xs, ys = _series(points, mode, key)
                axis.plot(xs, ys, marker=marker, color=colour, label=name)
            clients = sorted({float(p["clients"]) for p in points})
            if key == "events_per_s":
                axis.plot(clients, [c * 20 for c in clients], "k--", lw=0.8, label="offered")
            else:
                axis.axhline(50, color="k", ls="--", lw=0.8, label="50 ms")
                axis.set_yscale("log")
            axis.set_title(shell)
            axis.set_xlabel("clients at 20 events/s each")
            axis.grid(alpha=0.3)
        axes[0][0].set_ylabel(label)
        axes[0][-1].legend(fontsize=8)
        figure.tight_layout()
        path = out / filename
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written


if __name__ == "__main__":
    document = json.loads(Path(sys.argv[1]).read_text())
    for path in plot_gateway(document["scenarios"]["gateway"], sys.argv[2]):
        print(path)
