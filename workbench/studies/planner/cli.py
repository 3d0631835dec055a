"""``python -m workbench plan``: the plan advisor on the command line (issue 27).

    python -m workbench plan MODEL --ranks N --memory 24GiB [--hosts hosts.toml] [--global-batch B --seq-len T]
                             [--validate] [--json]

``MODEL`` is ``lm`` (the built-in LM), a ``.json`` file of the built-in LM's fields (``vocab_size``, ``seq_len``,
``dim``, ``num_layers``, ``num_heads``, ``mlp_dim``), or a factory ``package.module:function`` (with
``--vocab-size`` and ``--seq-len``). The terminal gets the ranked table, the pick and, with ``--validate``,
predicted against measured; ``--json`` prints one JSON object instead (:func:`plan_json`).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from workbench.core.checks import loads_bounded, read_user_text
from workbench.core.units import GiB, KiB, MiB, format_bytes

UNITS = {"": 1, "B": 1, "KiB": KiB, "MiB": MiB, "GiB": GiB, "TiB": 1024 * GiB}
MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_memory(text: str) -> int:
    """``"24GiB"``, ``"512 MiB"``, ``"1.5GiB"`` or ``"25769803776"`` as bytes.

    Raises:
        argparse.ArgumentTypeError: naming ``--memory`` and the forms it takes (argparse prefixes the flag).
    """
    match = MEMORY.match(str(text))
    unit = match.group(2) if match else None
    if match is None or unit not in UNITS:
        hint = " (binary units: write GiB, not GB)" if unit and unit.upper() in ("KB", "MB", "GB", "TB", "K", "M", "G") \
            else ""
        raise argparse.ArgumentTypeError(f"{text!r}: give bytes per rank, or a number with KiB, MiB or GiB "
                                         f"(e.g. 24GiB){hint}")
    value = float(match.group(1)) * UNITS[unit]
    if value < 1 or value != int(value):
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number of bytes >= 1 (e.g. 24GiB)")
    return int(value)


def add_plan_parser(sub) -> argparse.ArgumentParser:
    """The ``plan`` and ``review`` subcommands' arguments on ``sub`` (the command line's subparsers)."""
    p = sub.add_parser("plan", help="the plan that fits a memory budget per rank and is fastest, from the models "
                                    "(and --validate: run it)")
    add_plan_arguments(p, memory_required=True)
    p.add_argument("--validate", action="store_true", help="run the pick, the runner-up and DDP for real")
    p.add_argument("--top", type=int, default=12, help="rows of the table (default 12; --json has all)")
    p.add_argument("--json", action="store_true", help="print one JSON object: candidates, recommended, validated")
    r = sub.add_parser("review", help="the design review of your model and cluster as an offline deck: the plans, "
                                      "the pick, the Pareto figure and the validation runs (notebook 08)")
    add_plan_arguments(r, memory_required=False)
    r.add_argument("--out", type=Path, default=Path("build") / "review", help="output folder (default build/review)")
    r.add_argument("--static", action="store_true", help="also each figure as PNG/SVG and the deck as PDF")
    return p


def add_plan_arguments(p: argparse.ArgumentParser, *, memory_required: bool) -> None:
    p.add_argument("model", help="lm, a .json of the built-in LM's fields, or a factory package.module:function")
    p.add_argument("--ranks", type=int, default=None, help="N ranks (default: the hosts file's slots)")
    p.add_argument("--memory", type=parse_memory, required=memory_required, default=None,
                   help="memory per rank: bytes, or with KiB/MiB/GiB" + (
                       "" if memory_required else " (default: this machine's memory over the ranks)"))
    p.add_argument("--hosts", type=Path, default=None, help="a hosts file: run and benchmark there")
    p.add_argument("--launcher", default="ssh", help="with --hosts: ssh, mpi or slurm (default ssh)")
    p.add_argument("--global-batch", type=int, default=None, help="sequences per step over all ranks (default 8 per rank)")
    p.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default the model's)")
    p.add_argument("--vocab-size", type=int, default=None, help="a factory's vocabulary")
    p.add_argument("--framework", choices=("mlx", "jax"), default="mlx")
    p.add_argument("--margin", type=float, default=None, help="share of the budget a plan keeps free (default 0.1)")
    p.add_argument("--runs", type=Path, default=Path("runs") / "plan", help="run store (default runs/plan)")
    p.add_argument("--steps", type=int, default=8, help="steps of each validation run (default 8)")
    p.add_argument("--repeat", type=int, default=2, help="runs of each validated plan, each repeat in reverse order "
                                                         "(default 2: says whether the pick is within noise)")
    p.add_argument("--debug", action="store_true", help="show the full traceback of a failure")
    p.set_defaults(notebooks=[])


def review_parameters(args) -> str:
    """Notebook 08's parameter cell for ``review``'s arguments: each value checked, then written as a Python
    literal (a user's text never reaches the notebook as code)."""
    import ast
    import os

    if args.ranks is None and args.hosts is None:
        raise ValueError("--ranks: give the number of ranks (or --hosts)")
    memory = args.memory
    if memory is None:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (args.ranks or 1)
    values = {"MODEL": model_argument(args.model), "SEQ_LEN": args.seq_len, "VOCAB_SIZE": args.vocab_size,
              "NUM_RANKS": args.ranks, "HOSTS": None if args.hosts is None else str(args.hosts.resolve()),
              "MEMORY": int(memory), "GLOBAL_BATCH": args.global_batch or 8 * (args.ranks or 1),
              "FRAMEWORK": args.framework, "SAFETY_MARGIN": 0.1 if args.margin is None else float(args.margin),
              "VALIDATE_STEPS": int(args.steps), "RUNS": str(args.runs.resolve())}
    lines = []
    for name, value in values.items():
        text = repr(value)
        if ast.literal_eval(text) != value:
            raise ValueError(f"{name}={value!r}: not a plain value")
        lines.append(f"{name} = {text}")
    return "\n".join(lines)


def model_argument(text: str):
    """``lm``, a factory, or the dict a ``.json`` file of LM fields holds (read bounded; never evaluated)."""
    if text == "lm" or (":" in text and not text.endswith(".json")):
        return text
    path = Path(text)
    if path.suffix == ".json" and path.is_file():
        fields = loads_bounded(read_user_text(path, 1 << 20, f"model file {path}", "no model's fields are"),
                               f"model file {path}")
        if not isinstance(fields, dict):
            raise ValueError(f"model file {path}: a JSON object of the built-in LM's fields")
        return fields
    raise ValueError(f"MODEL {text!r}: give lm, a .json file of the built-in LM's fields, or a factory "
                     "package.module:function")


def run_plan(args) -> int:
    """The ``plan`` command: advise, print (table or JSON), and with ``--validate`` run and compare."""
    from workbench.studies.planner import SAFETY_MARGIN, advise_plan, validate_plan

    if args.ranks is None and args.hosts is None:
        raise ValueError("--ranks: give the number of ranks (or --hosts)")
    ranks = args.ranks
    batch = args.global_batch if args.global_batch is not None else 8 * (ranks or 1)
    advice = advise_plan(model_argument(args.model), num_ranks=ranks, hosts=args.hosts, launcher=args.launcher,
                         memory_bytes=args.memory, global_batch=batch, seq_len=args.seq_len,
                         vocab_size=args.vocab_size, framework=args.framework, runs_root=args.runs,
                         safety_margin=SAFETY_MARGIN if args.margin is None else args.margin)
    validation = validate_plan(advice, args.runs, steps=args.steps, repeats=args.repeat, hosts=args.hosts,
                               launcher=args.launcher) \
        if args.validate else None
    if args.json:
        print(json.dumps(plan_json(advice, validation), indent=1))
    else:
        print(format_advice(advice, top=args.top))
        if validation is not None:
            print(format_validation(validation))
    return 0 if advice.recommended is not None else 1


def plan_json(advice, validation=None) -> dict:
    """What ``--json`` prints: the advice (``candidates``, ``recommended``, ...) and, validated, ``validated``."""
    out = advice.to_dict()
    if validation is not None:
        out.update(validation.to_dict())
    return out


def format_advice(advice, *, top: int = 12) -> str:
    """The ranked table as text (:func:`~workbench.studies.planner.tables.advice_table`), then the pick."""
    from workbench.studies.planner.tables import advice_table

    table = advice_table(advice, top=top)
    pick = advice.recommended
    left = {col: f"{{:<{max(len(col), table[col].str.len().max())}}}".format for col in ("plan", "why")}
    lines = [table.to_string(formatters=left, justify="left")]
    lines.append(f"{len(advice.candidates)} plans priced ({len(advice.candidates) - len(table)} not shown; --json "
                 f"lists all); budget {format_bytes(advice.memory_bytes)} per rank, {advice.safety_margin:.0%} kept free")
    lines.append(f"links: {advice.links_source}; profile {advice.profile.key}")
    lines += [f"note: {n}" for n in advice.notes]
    lines.append(f"pick: {pick.label}: {format_bytes(pick.predicted_peak_bytes)} per rank, "
                 f"{pick.predicted_step_s * 1e3:.2f} ms per step" if pick else "pick: none fits")
    return "\n".join(lines)


def format_validation(validation) -> str:
    """Predicted against measured, per validated plan (the notebook's ``validation_table``), each run's status
    and id, and whether the orders agree."""
    from workbench.studies.planner.tables import order_line, validation_table

    table = validation_table(validation).drop(columns="run").reset_index()
    left = {col: f"{{:<{max(len(col), table[col].astype(str).str.len().max())}}}".format
            for col in ("role", "plan", "off")}
    runs = [f"{v.role}: {v.status} {', '.join(v.repeat_run_ids or (v.run_id,))}" for v in validation.runs]
    return "\n".join([table.to_string(index=False, formatters=left, justify="left", na_rep="-"), *runs, order_line(validation)])

