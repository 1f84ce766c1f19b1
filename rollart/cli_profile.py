"""``rollart calibrate profile``: measure a whole model's prefill and decode latency here
(``--engine torch|vllm``), or the kernels the cost model composes (``--engine kernels``).

The command function is registered by ``rollart.cli``; torch, transformers and vLLM are
imported only when it runs, so the rest of the CLI starts without them."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rollart.plan.schema import ModelSpec

if TYPE_CHECKING:  # pragma: no cover
    from rollart.calibration.profile_engine import Grid, Row

console = Console()
err_console = Console(stderr=True)

ENGINES = ("torch", "vllm", "kernels")


def _fail(message: str) -> None:
    err_console.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    raise typer.Exit(code=2)


def _validation_message(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        parts = []
        for err in errors():
            loc = ".".join(str(p) for p in err.get("loc", ()))
            msg = str(err.get("msg", "")).removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}" if loc else msg)
        if parts:
            return "; ".join(parts)
    return str(exc).splitlines()[0]


def resolve_model(model: str) -> tuple[ModelSpec, Optional[Path]]:
    """A preset name, a Hugging Face ``config.json`` (or its folder), or a YAML/JSON of
    :class:`ModelSpec` fields (``preset:`` allowed) → the spec and, for a Hugging Face config,
    the path an engine can load it from. Raises ValueError with a one-line message."""
    from pydantic import ValidationError

    from rollart.calibration.profile_engine import spec_from_hf_config

    path = Path(model)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if not path.is_file():
        if path.suffix.lower() in (".json", ".yaml", ".yml") or path.name != model:
            raise ValueError(f"--model: no such file '{model}'")
        try:
            return ModelSpec.model_validate(model), None
        except ValidationError as exc:
            raise ValueError(f"--model: {_validation_message(exc)}") from None
    text = path.read_text()
    try:
        if path.suffix.lower() == ".json":
            data = json.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text)
    except (json.JSONDecodeError, ValueError) as exc:
        raise ValueError(f"--model: {path}: not valid {path.suffix.lstrip('.').upper() or 'YAML'}: {str(exc).splitlines()[0]}") from None
    except Exception as exc:  # yaml.YAMLError
        raise ValueError(f"--model: {path}: not valid YAML: {str(exc).splitlines()[0]}") from None
    if isinstance(data, dict) and ("num_hidden_layers" in data or "text_config" in data):
        try:
            name = path.parent.name if path.name == "config.json" and path.parent.name else path.stem
            return spec_from_hf_config(data, name=name), path
        except (ValidationError, ValueError) as exc:
            raise ValueError(f"--model: {path}: {_validation_message(exc)}") from None
    if isinstance(data, dict) and isinstance(data.get("model"), (dict, str)) and "layers" not in data:
        data = data["model"]  # a plan file: its model section
    try:
        spec = ModelSpec.model_validate(data)
    except ValidationError as exc:
        raise ValueError(f"--model: {path}: {_validation_message(exc)}") from None
    if spec.name == "custom":
        spec = spec.model_copy(update={"name": path.stem})
    return spec, None


def estimate_bytes(spec: ModelSpec, grid: "Grid", dtype_bytes: int) -> int:
    """Weights in the profiled dtype plus the KV cache of the largest grid point."""
    kv_per_token = 2 * spec.layers * spec.kv_heads * spec.head_dim * dtype_bytes
    return spec.params * dtype_bytes + grid.peak_kv_tokens * kv_per_token


def _gib(n: float) -> str:
    return f"{n / 2**30:,.1f} GiB"


def summary_tables(rows: list["Row"]) -> list[Table]:
    """Prefill ms by new tokens × batch (no cache), decode ms by kv_len × batch."""
    tables = []
    pre = [r for r in rows if r.phase == "prefill"]
    if pre:
        kv0 = min(r.kv_len for r in pre)
        pre = [r for r in pre if r.kv_len == kv0]
        batches = sorted({r.batch_size for r in pre})
        t = Table(title=f"prefill ms (kv_len {kv0}) by new tokens per sequence × batch", title_justify="left")
        t.add_column("new tokens", justify="right")
        for b in batches:
            t.add_column(f"b={b}", justify="right")
        cell = {(r.new_tokens, r.batch_size): r.latency_us / 1e3 for r in pre}
        for n in sorted({r.new_tokens for r in pre}):
            t.add_row(str(n), *(f"{cell[(n, b)]:.2f}" if (n, b) in cell else "-" for b in batches))
        tables.append(t)
    dec = [r for r in rows if r.phase == "decode"]
    if dec:
        batches = sorted({r.batch_size for r in dec})
        t = Table(title="decode step ms by kv_len × batch", title_justify="left")
        t.add_column("kv_len", justify="right")
        for b in batches:
            t.add_column(f"b={b}", justify="right")
        cell = {(r.kv_len, r.batch_size): r.latency_us / 1e3 for r in dec}
        for kv in sorted({r.kv_len for r in dec}):
            t.add_row(str(kv), *(f"{cell[(kv, b)]:.2f}" if (kv, b) in cell else "-" for b in batches))
        tables.append(t)
    return tables


def calibrate_profile(
    engine: str = typer.Option("torch", "--engine", help=f"inference engine: {', '.join(ENGINES)}"),
    model: str = typer.Option("Qwen3-tiny", "--model",
                              help="preset name or a path to a config.json / model YAML"),
    out: Path = typer.Option(..., "--out", help="CSV to write (phase,dtype,kv_dtype,batch_size,kv_len,new_tokens,latency_us,mfu); "
                                                      "a folder with --engine kernels"),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda[:N] (the vllm engine always uses CUDA)"),
    repeats: int = typer.Option(5, "--repeats", min=1, help="timed repeats per point (the median is kept)"),
    peak_tflops: Optional[float] = typer.Option(None, "--peak-tflops", min=0.0,
                                                help="peak TFLOP/s for MFU; measured with a matmul if omitted"),
    tp: int = typer.Option(1, "--tp", min=1, help="tensor parallel size (vllm)"),
    shapes: Optional[str] = typer.Option(None, "--shapes",
                                         help="kernels: 'full' (Qwen3-8B/14B/32B layers; default on CUDA) or "
                                              "'tiny' (Qwen3-tiny; default on CPU)"),
) -> None:
    """Measure prefill and decode latency of a whole model over a grid on this machine
    (--engine kernels: time GEMMs, attention and a device copy into the folder --out)."""
    if engine not in ENGINES:
        _fail(f"--engine: unknown engine '{engine}'; engines are: {', '.join(ENGINES)}")
    if device != "cpu" and not device.startswith("cuda"):
        _fail(f"--device: '{device}' is not a device; use cpu or cuda[:N]")
    if peak_tflops is not None and peak_tflops <= 0:
        _fail("--peak-tflops: must be positive")
    if engine == "kernels":
        if model != "Qwen3-tiny" or tp != 1:
            _fail(f"{'--model' if model != 'Qwen3-tiny' else '--tp'}: --engine kernels times the layer shapes of "
                  "the --shapes preset's models on one device")
        profile_kernels_cli(out, device, shapes, repeats, peak_tflops)
        return
    if shapes is not None:
        _fail("--shapes: only for --engine kernels")
    try:
        spec, hf_path = resolve_model(model)
    except ValueError as exc:
        _fail(str(exc))
        return

    from rollart.calibration import profile_engine as pe

    if engine == "vllm":
        device = "cuda"
        profiler: pe.EngineProfiler = pe.VllmProfiler(hf_path if hf_path is not None else spec, tp=tp,
                                                      repeats=repeats, peak_tflops=peak_tflops)
        dtype = "bf16"
    else:
        try:
            torch_profiler = pe.TorchProfiler(spec, device=device, repeats=repeats, peak_tflops=peak_tflops)
        except ValueError as exc:
            _fail(str(exc))
            return
        profiler, dtype = torch_profiler, torch_profiler.dtype
    ok, why = profiler.available()
    if not ok:
        _fail(f"--engine {engine}: {why}")

    try:
        memory = pe.device_memory_bytes(device)
    except Exception as exc:  # a bad --device string reaches torch here
        _fail(f"--device: cannot read memory of '{device}': {str(exc).splitlines()[0]}")
        return
    grid = pe.default_grid(spec, device, memory_bytes=memory)
    need = estimate_bytes(spec, grid, pe.dtype_bytes(dtype))
    budget = 0.9 * memory * (tp if engine == "vllm" else 1)
    if need > budget:
        _fail(f"--model: {spec.name} needs about {_gib(need)} ({pe.short_dtype(dtype)} weights + KV of the grid) "
              f"but {device} has {_gib(memory)}; pick a smaller model or a bigger device")

    t0 = time.perf_counter()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task(f"profiling {spec.name} on {engine}/{device}", total=len(grid))
        rows = profiler.profile(grid, progress=lambda done, total: bar.update(task, completed=done, total=total))
    wall = time.perf_counter() - t0
    pe.write_rows(rows, out)

    for table in summary_tables(rows):
        console.print(table)
    peak = getattr(profiler, "peak_tflops", None)
    peak_note = f" · peak {peak:,.3g} TFLOP/s ({'given' if peak_tflops is not None else 'measured'})" if peak else ""
    best = max((r.mfu for r in rows), default=0.0)
    console.print(f"[dim]{len(rows)} points in {wall:.1f} s · {spec.name} {pe.short_dtype(dtype)} on {engine}/{device}"
                  f"{peak_note} · best MFU {best:.3g}[/]", highlight=False)
    console.print(f"[dim]wrote {escape(str(out))}[/]", highlight=False)


def profile_kernels_cli(out: Path, device: str, shapes: Optional[str], repeats: int,
                        peak_tflops: Optional[float]) -> None:
    """``--engine kernels``: time the grid's kernels into the folder ``out`` (see
    ``rollart.calibration.gpu_kernels``)."""
    import shlex

    from rollart.calibration import gpu_kernels as gk

    shapes = shapes or ("full" if device.startswith("cuda") else "tiny")
    if shapes not in gk.GRIDS:
        _fail(f"--shapes: unknown shapes '{shapes}'; use one of {', '.join(gk.GRIDS)}")
    if out.exists() and not out.is_dir():
        _fail(f"--out: {out} is a file; --engine kernels writes a folder")
    try:
        import torch
    except ImportError:
        _fail("--engine kernels: torch is not installed")
        return
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            _fail(f"--device: {device}: no CUDA GPU here (torch {torch.__version__}, cuda build "
                  f"{torch.version.cuda or 'none'})")
        try:
            torch.device(device)
            torch.cuda.get_device_properties(device)
        except (RuntimeError, AssertionError, ValueError) as exc:
            _fail(f"--device: cannot use '{device}': {str(exc).splitlines()[0]}")
    grid = gk.GRIDS[shapes]
    # the command as parsed (not sys.argv, which is the caller's: pytest's, a script's)
    command = shlex.join(["rollart", "calibrate", "profile", "--engine", "kernels", "--device", device,
                          "--shapes", shapes, "--repeats", str(repeats), "--out", str(out),
                          *(["--peak-tflops", f"{peak_tflops:g}"] if peak_tflops is not None else [])])
    t0 = time.perf_counter()
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task(f"timing kernels ({shapes}) on {device}", total=len(grid))
        info = gk.profile_kernels(out, device, grid, repeats=repeats, peak_tflops=peak_tflops, command=command,
                                  progress=lambda done, total: bar.update(task, completed=done, total=total))
    rows = info["rows"]
    console.print(f"[dim]{sum(rows.values())} kernels in {time.perf_counter() - t0:.1f} s on {escape(info['gpu'])} "
                  f"({info['dtype']}): " + ", ".join(f"{k} {v}" for k, v in rows.items())
                  + f" · peak {info['peak_tflops']:,.4g} TFLOP/s ({info['peak_source'].split(' ')[0]}) · "
                  f"copy {info['copy_tbps']:.4g} TB/s[/]", highlight=False)
    console.print(f"[dim]wrote {escape(str(out))}/ ({', '.join([*gk.FILES.values(), gk.PROVENANCE])}); fit it with "
                  f"`rollart calibrate fit {escape(str(out))} --gpu <name>`[/]", highlight=False)


def fit_kernels(folder: Path, gpu: str, out: Optional[Path]) -> None:
    """``rollart calibrate fit FOLDER``: a kernel profile from ``--engine kernels`` timings, its
    held-out MAPE and the datasheet roofline's error per kernel family."""
    from rollart.calibration import gpu_kernels as gk
    from rollart.calibration.profiles import save_profile

    try:
        profile = gk.fit_profile(folder, gpu)
        table = gk.compare_roofline(folder, gpu, profile)
    except gk.KernelDataError as exc:
        _fail(str(exc))
        return
    out = out or Path(f"{gpu.lower()}.yaml")
    out.parent.mkdir(parents=True, exist_ok=True)
    save_profile(profile, out, header=f"{profile.gpu} kernel profile fitted from {folder} by `rollart calibrate fit`.\n"
                                      "Measured kernel timings; see the folder's provenance.json.")
    for label, c in (("gemm", profile.gemm), ("attn prefill", profile.attn_prefill),
                     ("attn decode", profile.attn_decode)):
        console.print(f"{label}: held-out MAPE {_pct(c.mape_heldout)} ({c.heldout_rows} of {c.rows + c.heldout_rows} rows)")
    fe = profile.fit_error
    console.print(f"held-out MAPE: prefill {_pct(fe.prefill_mape_heldout)} · decode {_pct(fe.decode_mape_heldout)}")
    typer.echo(gk.format_table(table, f"datasheet roofline vs measured on {gpu}"))  # unwrapped: a Markdown table
    console.print(f"wrote {escape(str(out))}; use it with cluster.gpu_pools.<pool>.profile: {escape(str(out))}")


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1%}"


__all__ = ["calibrate_profile", "estimate_bytes", "fit_kernels", "profile_kernels_cli", "resolve_model",
           "summary_tables"]
