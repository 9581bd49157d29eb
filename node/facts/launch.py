"""How this node's torchrun parses the training command: its own parser, its own version."""

from __future__ import annotations

import contextlib
import io


def torchrun_parse(launch_args: list[str], nnodes: int, nproc_per_node: int) -> dict | None:
    if not launch_args:
        return None
    try:
        from torch.distributed.run import get_args_parser
    except ImportError as exc:
        return {"error": f"torchrun is not importable here ({exc})"}
    argv = ["--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node), *launch_args]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            args = get_args_parser().parse_args(argv)
    except SystemExit:
        message = [line for line in stderr.getvalue().splitlines() if "error:" in line]
        return {"parsed": False, "message": message[-1].split("error:", 1)[1].strip() if message
                else stderr.getvalue().strip()[-300:]}
    return {"parsed": True, "training_script": args.training_script,
            "training_script_args": list(args.training_script_args), "module": bool(args.module),
            "run_path": bool(args.run_path), "no_python": bool(args.no_python)}
