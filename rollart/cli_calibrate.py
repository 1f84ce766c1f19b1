"""``rollart calibrate``: inspect shipped GPU profiles, fit your own, profile engines, fit env tails."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

calibrate_app = typer.Typer(add_completion=False, no_args_is_help=True,
                            help="Cost-model calibration: GPU profiles, engine profiling, env latency tails.")
console = Console()
err_console = Console(stderr=True)


def _fail(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def _resolve_profile(name: str) -> Path:
    from rollart.calibration.profiles import shipped_profile_path, shipped_profiles

    path = Path(name)
    if path.is_file():
        return path
    shipped = shipped_profile_path(name)
    if shipped is None:
        _fail(f"no profile '{name}': shipped profiles are {', '.join(shipped_profiles())}, or give a YAML path")
    return shipped  # type: ignore[return-value]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


LINKS = "links"  # the shipped link table, listed with the GPU profiles


def _overview() -> None:
    """One line per shipped profile: what it fits, how well, and which terms are measured on that GPU,
    derived from another GPU's timings, or assumed."""
    from rollart.calibration.profiles import KernelProfile, load_profile, shipped_profile_path, shipped_profiles

    table = Table(box=None, pad_edge=False)
    for col in ("profile", "what", "held-out MAPE", "terms"):
        table.add_column(col, overflow="fold")
    for name in shipped_profiles():
        if name == LINKS:
            from rollart.calibration.links import calibrated_links

            links = calibrated_links()
            fitted = [k for k, v in links.items() if v.get("mape_heldout") is not None]
            rated = [k for k, v in links.items() if k not in fitted and "bandwidth_gbps" in v]
            table.add_row(name, "link models", " · ".join(f"{k} {_pct(links[k]['mape_heldout'])}" for k in fitted),
                          f"measured: {', '.join(fitted)} (NCCL timings) · line rates: {', '.join(rated)}")
            continue
        profile = load_profile(shipped_profile_path(name))
        if not isinstance(profile, KernelProfile):
            table.add_row(name, profile.kind, "", "")
            continue
        parts: dict[str, list[str]] = {"measured": [], "derived": []}
        for label, c in profile.terms():
            parts["derived" if c.derived else "measured"].append(label)
        fe = profile.fit_error
        table.add_row(name, f"{profile.gpu} kernels",
                      f"prefill {_pct(fe.prefill_mape_heldout)} · decode {_pct(fe.decode_mape_heldout)}"
                      + ("" if parts["measured"] else " (other GPUs' rows)"),
                      f"measured: {', '.join(parts['measured']) or 'none'} · derived: "
                      f"{', '.join(parts['derived']) or 'none'} · assumed: iteration overhead "
                      f"{profile.iteration_overhead_s * 1e3:g} ms")
    console.print(table)
    _serving_overview()
    console.print("[dim]rollart calibrate show <profile>: the formulas, coefficients, data, each term's dtype and "
                  "how every derived term was derived[/]")



def _serving_overview() -> None:
    """The shipped profiles composed for the end-to-end serving setups measured with SGLang (nothing
    is fitted to these)."""
    from rollart.calibration.serving import serving_checks

    table = Table(box=None, pad_edge=False, title="end to end: measured serving (SGLang, InferSim README) vs "
                  "the composed profiles, tokens per GPU per second", title_justify="left")
    for col in ("model", "phase", "measured", "rollart", "error", "setup"):
        table.add_column(col, overflow="fold", justify="right" if col in ("measured", "rollart", "error") else "left")
    for c in serving_checks():
        table.add_row(f"{c.model} {c.weight_dtype} · {c.gpu}", c.phase, f"{c.measured_tgs:,.0f}",
                      f"{c.predicted_tgs:,.0f}", f"{c.error:+.1%}", c.setup)
    console.print(table)


def _show_links() -> None:
    from rollart.calibration.links import LINKS_FILE, calibrated_links
    from rollart.sim.costs.link import measured_store

    console.print(f"[bold]link models[/] ({LINKS_FILE})")
    table = Table(box=None, pad_edge=False)
    for col in ("link", "bandwidth", "latency", "held-out MAPE", "source"):
        table.add_column(col, overflow="fold")
    for kind, v in calibrated_links().items():
        if "bandwidth_gbps" in v:
            table.add_row(kind, f"{v['bandwidth_gbps']:g} Gbps", f"{v['latency_us']:g} µs",
                          _pct(v.get("mape_heldout")), v.get("source", ""))
    console.print(table)
    store = measured_store()
    if store:
        console.print(f"[bold]weight store, per bucket[/]: on a TCP link publish {store['publish_s'] * 1e3:.1f} ms · "
                      f"pull {store['pull_s'] * 1e3:.1f} ms (measured through the real Mooncake store's TCP transport, "
                      "calibration/data/weight_transfer/measured.yaml); on an RDMA/IB link "
                      f"{calibrated_links().get('store', {}).get('bucket_overhead_s', 0) * 1e3:.1f} ms (assumed: "
                      "a metadata round trip, no per-transfer socket exchange)", highlight=False)
    else:
        console.print(f"[bold]weight store, per bucket[/]: "
                      f"{calibrated_links().get('store', {}).get('bucket_overhead_s', 0) * 1e3:.1f} ms (assumed: "
                      "no measurement shipped)", highlight=False)


@calibrate_app.command()
def show(name: Optional[str] = typer.Argument(None, help="a shipped profile (h800, h20, h100, h200, a100, b200, gb200, links) or a profile "
                                                         "YAML; none: one line per shipped profile"),
         plot: Optional[Path] = typer.Option(None, "--plot", help="draw measured vs fitted to this PNG")) -> None:
    """Print a fitted profile: models, coefficients, data, held-out errors and assumptions."""
    from rollart.calibration.profiles import KernelProfile, TrainProfile, load_profile

    if name is None:
        if plot is not None:
            _fail("--plot: name the profile to draw (rollart calibrate show <profile> --plot FILE)")
        return _overview()
    if name == LINKS and not Path(name).is_file():
        if plot is not None:
            _fail("--plot: the link models have no plot; give a GPU profile")
        return _show_links()
    path = _resolve_profile(name)
    try:
        profile = load_profile(path)
    except Exception as exc:  # noqa: BLE001 - any parse/validation problem is the user's file
        _fail(f"{path}: not a valid profile ({str(exc).splitlines()[0]})")
        return
    name = profile.gpu if isinstance(profile, KernelProfile) else f"{profile.gpu} / {profile.model}"
    console.print(f"[bold]{name} {profile.kind} profile[/] ({path})")
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column(overflow="fold")
    if isinstance(profile, KernelProfile):
        components = [("gemm", profile.gemm), ("gemm fp8", profile.gemm_fp8),
                      ("grouped gemm fp8", profile.gemm_grouped_fp8), ("attn prefill", profile.attn_prefill),
                      ("attn decode", profile.attn_decode), ("attn decode fp8 kv", profile.attn_decode_fp8_kv),
                      ("hbm stream", profile.stream), ("all-reduce", profile.allreduce),
                      ("all-reduce ≤ max_bytes (custom)", profile.allreduce_custom)]
        components = [(label, c) for label, c in components if c is not None]
    elif isinstance(profile, TrainProfile):
        components = [("train step", profile.step)]
    else:
        components = [("prefill", profile.prefill), ("decode", profile.decode)]
    for label, c in components:
        table.add_row(label, c.formula)
        table.add_row("", "  ".join(f"{k} = {v:.4g}" for k, v in c.params.items()))
        if c.mape_heldout is not None:
            table.add_row("", f"MAPE held-out {_pct(c.mape_heldout)} ({c.heldout_rows} rows) · "
                              f"train {_pct(c.mape_train)} ({c.rows} rows)")
        else:
            table.add_row("", "no held-out rows: not measured on this GPU")
        if c.derived:
            table.add_row("", f"[yellow]derived:[/] {c.derived}")
        files = c.data if len(c.data) <= 2 else [*c.data[:1], f"… and {len(c.data) - 1} more files"]
        table.add_row("", "[dim]data: " + ", ".join(files) + "[/]")
    console.print(table)
    if isinstance(profile, TrainProfile):
        console.print(f"[bold]weight hand-off[/]: publish + pull {profile.publish_pull_s:.3f} s · broadcast "
                      f"{profile.broadcast_s:.3f} s · swap {profile.swap_s:.3f} s")
    else:
        fe = profile.fit_error
        console.print(f"[bold]held-out MAPE[/]: prefill {_pct(fe.prefill_mape_heldout)} · decode "
                      f"{_pct(fe.decode_mape_heldout)}  [dim]({fe.note})[/]")
    if isinstance(profile, KernelProfile):
        from rollart.calibration.profiles import term_lines

        console.print(f"iteration overhead {profile.iteration_overhead_s * 1e3:.1f} ms · datasheet "
                      f"{profile.peak_tflops_bf16:g} TFLOP/s BF16, {profile.hbm_tbps:g} TB/s")
        for term, dtype, how in term_lines(profile):
            console.print(f"[bold]term[/] {term}: dtype {dtype} · {how}", soft_wrap=True, highlight=False)
        from rollart.calibration.profiles import shipped_profile_path

        shipped = shipped_profile_path(profile.gpu)  # a profile YAML of the user's is priced as measured
        bound = _floors_line(profile.gpu) if shipped is not None and shipped.resolve() == path.resolve() else ""
        if bound:
            console.print(f"[bold]floors[/]: {bound}", soft_wrap=True, highlight=False)
    console.print(f"[bold]source[/]: {profile.source}")
    for a in profile.assumptions:
        console.print(f"[bold]assumption[/]: {a}", soft_wrap=True)
    if plot is not None:
        from rollart.calibration.plots import plot_profile

        try:
            plot_profile(profile, plot)
        except ValueError as exc:
            _fail(f"--plot: {exc}")
        console.print(f"[dim]wrote {plot}[/]")


def _floors_line(gpu_name: str) -> str:
    """What holds a shipped kernel profile's steps down (``calibration.generation_cost``): the presets its
    datasheet matches or beats, and for FP8 weights the weight-only path; '' where nothing does."""
    from rollart.calibration import beaten_presets
    from rollart.plan.presets import GPU_PRESETS, canonical_gpu
    from rollart.plan.schema import GpuType

    preset = canonical_gpu(gpu_name)
    if preset is None:
        return ""
    gpu = GpuType(**GPU_PRESETS[preset])
    parts = []
    bf16, fp8 = beaten_presets(gpu, fp8=False), beaten_presets(gpu, fp8=True)
    for label, beaten in ((("BF16 and FP8", bf16),) if bf16 == fp8 else (("BF16", bf16), ("FP8", fp8))):
        if beaten:
            parts.append(f"{label} weights: each step at most its price on {', '.join(beaten)} (every timing "
                         "figure matched or beaten)")
    if gpu.tflops_fp8:
        parts.append("FP8 weights: at most their price served weight-only (BF16 compute, 1-byte weight reads)")
    return "; ".join(parts)


@calibrate_app.command()
def fit(csv_path: Path = typer.Argument(..., help="a CSV written by `rollart calibrate profile` (a folder: "
                                                   "--engine kernels timings → a kernel profile)"),
        gpu: str = typer.Option(..., "--gpu", help="the device name the profile is for (e.g. cpu-local)"),
        model: str = typer.Option("Qwen3-tiny", "--model", help="the model that was profiled"),
        engine: str = typer.Option("torch", "--engine"),
        out: Optional[Path] = typer.Option(None, "--out", help="profile YAML (default <gpu>.profile.yaml)")) -> None:
    """Fit an engine profile (prefill and decode vs tokens, batch and cached context) from a CSV."""
    from rollart.calibration.engine_fit import EngineFitError, fit_engine_csv
    from rollart.calibration.profiles import save_profile

    if csv_path.is_dir():  # a folder of kernel timings (`calibrate profile --engine kernels`)
        from rollart.cli_profile import fit_kernels

        return fit_kernels(csv_path, gpu, out)
    if not csv_path.is_file():
        _fail(f"{csv_path}: no such file")
    try:
        profile = fit_engine_csv(csv_path, gpu=gpu, model=model, engine=engine)
    except EngineFitError as exc:
        _fail(str(exc))
        return
    out = out or Path(f"{gpu}.profile.yaml")
    save_profile(profile, out, header=f"{gpu} / {model} engine profile fitted from {csv_path} by `rollart calibrate fit`.")
    console.print(f"prefill: {profile.prefill.formula} — held-out MAPE {_pct(profile.prefill.mape_heldout)}")
    console.print(f"decode:  {profile.decode.formula} — held-out MAPE {_pct(profile.decode.mape_heldout)}")
    console.print(f"wrote {out}; use it with cluster.gpu_pools.<pool>.profile: {out}")


def _register_optional() -> None:
    """Commands whose modules bring heavier imports (torch) load only when invoked."""
    try:
        from rollart.cli_profile import calibrate_profile

        calibrate_app.command("profile")(calibrate_profile)
    except ImportError:  # pragma: no cover - the module ships with the package
        pass
    try:
        from rollart.cli_env import calibrate_env

        calibrate_app.command("env")(calibrate_env)
    except ImportError:  # pragma: no cover
        pass


_register_optional()
