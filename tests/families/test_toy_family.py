"""Adding a family takes at most six files, tests aside: its kernel module, its family package (one
``__init__.py`` holding plan, run, figure and evaluator), its ``family.yaml`` (columns, config schema, claims),
its figure's caption, one line of the registry and its config section (docs/experiments.md lists them). A toy
family (a Triton kernel that scales a vector, one experiment, one figure, one claim of its own, under a report
topic of its own) is added that way to a copy of the repository, and the workflow runs it on the CPU (the
``cpu`` GPU type: Triton's interpreter) end to end: its benchmark job, the collected table, its figure, the
audit's verdict on its claim, and the report."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pandas as pd
import pytest
from snakemake_helpers import interpreter_blocker, job_counts, snakemake

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("Snakefile", "workflow", "kernels", "analysis", "reports", "envs")

# ---- file 1: the kernel, its launcher and its float64 reference -------------------------------------------
KERNEL = {
    "kernels/toy.py": '''
        """A toy kernel family: ``scale(x, alpha)`` = alpha · x, and its float64 reference."""

        import torch
        import triton
        import triton.language as tl


        @triton.jit
        def scale_kernel(x_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
            offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
            mask = offs < n
            tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * alpha, mask=mask)


        def scale(x: torch.Tensor, alpha: float) -> torch.Tensor:
            x = x.contiguous()
            out = torch.empty_like(x)
            block = 128 if x.numel() >= 128 else 32
            scale_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), alpha, BLOCK=block)
            return out


        def reference(x: torch.Tensor, alpha: float) -> torch.Tensor:
            return x.double() * alpha
    ''',
}

# ---- files 2-4: the family -- its plan, run, figure and evaluator in one package; its columns, config
# schema and claim in one family.yaml; the figure's caption ----------------------------------------------------
FAMILY = {
    "analysis/families/toy/__init__.py": '''
        """The toy family: the toy kernel against its float64 reference, one experiment, one figure, one claim."""

        import dataclasses

        from analysis.audit import Claim, Context, Evaluators, Untestable, Verdict
        from analysis.audit.verdicts import judge_at_most, on_each_gpu
        from analysis.core.family import Family, Figure

        FAMILY = Family(name="toy", package=__name__, title="Toy scaling", sections=(("toy", "Toy scaling"),))

        # ---- plan: one experiment, one shard of the config section (no torch here: the workflow plans with it)
        EXPERIMENTS = ("toy-scale",)


        @dataclasses.dataclass
        class ToySpec:
            sizes: list[int]
            alpha: float
            bound: float = 1e-6
            seed: int = 0

            def points(self) -> int:
                return len(self.sizes)


        def spec(fields: dict) -> ToySpec:
            return ToySpec(**fields)


        def shards(config: dict) -> dict[str, dict]:
            toy = config["toy"]
            return {"toy_scale": {"sizes": list(toy["sizes"]), "alpha": toy["alpha"]}}


        # ---- run: one row per size, the kernel's error against the float64 reference
        def run(spec, env, device, log_line, files=None) -> list[dict]:
            import torch

            from analysis.core.provenance import now_utc, row_provenance
            from kernels import toy

            gen = torch.Generator(device=device).manual_seed(spec.seed)
            rows = []
            for n in spec.sizes:
                x = torch.randn(n, generator=gen, device=device)
                err = (toy.scale(x, spec.alpha).double() - toy.reference(x, spec.alpha)).abs().max().item()
                ok = err <= spec.bound
                rows.append(dict(experiment="toy-scale", family="toy", impl="ours-toy", size=n,
                                 status="ok" if ok else "mismatch", message="" if ok else f"error {err:.3g}",
                                 timed=False, max_abs_err=err, err_bound=spec.bound, timestamp=now_utc(),
                                 **row_provenance(env)))
                log_line(f"toy n={n}: error {err:.3g}")
            return rows


        # ---- figures: its error against the size
        def toy_error(df, out_png):
            import matplotlib.pyplot as plt

            from analysis.core.plotting import NoDataError, save

            d = df[df["status"] == "ok"]
            if d.empty:
                raise NoDataError("no ok toy rows")
            fig, ax = plt.subplots()
            ax.plot(d["size"], d["max_abs_err"], marker="o")
            ax.set_xlabel("size")
            ax.set_ylabel("max abs error")
            save(fig, out_png)
            return d[["size", "max_abs_err"]]


        FIGURES = {"toy_error": Figure(toy_error, "toy")}

        # ---- claims: the evaluator of its claim, from its table
        EVALUATORS = Evaluators()


        @EVALUATORS("toy_exact")
        def toy_exact(claim: Claim, ctx: Context) -> list[Verdict]:
            results = ctx.table("toy")

            def one(gpu):
                rows = results.rows(gpu, experiment="toy-scale")
                if rows.empty:
                    raise Untestable("no toy rows")
                worst = float(rows["max_abs_err"].max())
                return Verdict(judge_at_most(worst, claim.asserted["at_most"]), f"{worst:.2g}",
                               f"{len(rows)} sizes", f"{results.paths[gpu]}: experiment=toy-scale", gpu=gpu)

            return on_each_gpu(results, one, "the toy experiment")
    ''',
    "analysis/families/toy/family.yaml": """
        columns:
          description: one toy point.
          columns: [experiment, family, impl, size, status, message, timed, max_abs_err, err_bound, gpu_name, gpu,
                    driver, cuda, torch, triton, python, git_sha, timestamp]
          properties:
            size: {description: "Elements scaled.", type: integer, minimum: 1}
        config:
          description: The toy family.
          type: object
          additionalProperties: false
          default: {}
          properties:
            enabled: {description: "Run it.", type: boolean, default: true}
            sizes: {description: "Vector sizes.", type: array, items: {type: integer, minimum: 1}, default: [7, 300]}
            alpha: {description: "The scale.", type: number, default: 1.5}
        claims:
          sources:
            TOY: {file: toy.txt, title: "The toy note"}
          topics:
            toy: Toy scaling
          claims:
            - id: toy-exact
              topic: toy
              headline: true
              source: {article: TOY, section: "1", section_en: "Section 1"}
              statement: Scaling in float32 is exact to float64 within a millionth.
              quote:
                - {article: TOY, text: "Scaling a vector is exact to a millionth."}
              asserted: {at_most: 1.0e-6}
              wording: within a millionth
              tolerance: 0
              kind: [measured]
              evaluator: toy_exact
              figure: toy_error
    """,
    "analysis/families/toy/captions/toy_error.rst": """
        The toy kernel's largest error against float64, per vector size.
    """,
}

# ---- file 6: its config section (file 5: the registry's line, below); the run's own file turns the others off
SECTION = "toy:\n  enabled: true\n  sizes: [7, 300]\n  alpha: 1.5\n"
RUN = """gpus: [cpu]
reference_dir: null
attention: {enabled: false, interpreter_check: {enabled: false}}
fp8: {enabled: false}
traffic: {enabled: false}
compiled: {enabled: false}
w4a16: {enabled: false}
moe: {enabled: false}
"""


def _add_family(work: Path) -> set[str]:
    """Add the toy family to the copy ``work``; the paths it touched, relative to ``work``."""
    touched = set()
    for rel, text in {**KERNEL, **FAMILY}.items():
        path = work / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text).lstrip())
        touched.add(rel)
    registry = work / "analysis" / "registry.py"  # file 5: one line (its import and its place in the order)
    text = registry.read_text()
    imports = "from analysis.families import attention, compiled, fp8, moe, traffic, w4a16\n"
    order = "(attention, fp8, traffic, w4a16, moe, compiled)"
    assert imports in text and order in text, "the registry's line changed: update this test"
    registry.write_text(
        text.replace(imports, imports.replace("w4a16\n", "toy, w4a16\n")).replace(
            order, order.replace("compiled)", "compiled, toy)")
        )
    )
    config = work / "workflow" / "config.yaml"
    config.write_text(config.read_text() + "\n" + SECTION)
    return touched | {"analysis/registry.py", "workflow/config.yaml"}


def _tree(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for name in COPIED
        for p in ([root / name] if (root / name).is_file() else (root / name).rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    blocker = interpreter_blocker()
    if blocker:
        pytest.skip(blocker)
    work = tmp_path_factory.mktemp("toy") / "repo"
    work.mkdir()
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, work / name, ignore=shutil.ignore_patterns("__pycache__", "reference"))
        else:
            shutil.copy(src, work / name)
    before = _tree(work)
    touched = _add_family(work)
    after = _tree(work)
    changed = {p for p in after if before.get(p) != after[p]}
    assert changed == touched
    assert len(changed) <= 6, sorted(changed)  # a whole family (kernel, experiment, figure, claim, config) in six
    (work / "run.yaml").write_text(RUN)
    r = snakemake("-n", "--cores", "1", "--configfile", "run.yaml", cwd=work)
    assert r.returncode == 0, r.stderr[-4000:]
    assert job_counts(r.stdout)["benchmark"] == 1
    r = snakemake("--cores", "2", "--configfile", "run.yaml", cwd=work, timeout=900)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    return work


def test_the_toy_family_runs_through_the_cpu_pipeline(toy_run):
    results = toy_run / "results"
    shard = pd.read_csv(results / "cpu" / "toy" / "toy_scale.csv")
    table = pd.read_csv(results / "cpu" / "toy.csv")
    assert list(table["size"]) == [7, 300] and set(table["status"]) == {"ok"} and table.equals(shard)
    assert (table["max_abs_err"] <= table["err_bound"]).all() and set(table["gpu"]) == {"cpu"}

    figure = results / "report" / "cpu" / "toy"
    assert (figure / "toy_error.png").stat().st_size > 1000
    assert list(pd.read_csv(figure / "toy_error.csv")["size"]) == [7, 300]

    verdicts = pd.read_csv(results / "audit" / "verdicts.csv", keep_default_na=False)
    toy = verdicts[verdicts["claim_id"] == "toy-exact"]
    assert list(toy["gpu"]) == ["cpu"] and list(toy["verdict"]) == ["holds"]
    assert "toy.csv" in toy.iloc[0]["evidence"]

    html = (results / "report.html").read_text()
    assert "Toy scaling" in html and "toy-exact" in html and "per vector size" in html
