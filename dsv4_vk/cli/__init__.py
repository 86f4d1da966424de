"""The command line: `dsv4_vk <command>` (or `python -m dsv4_vk <command>`): info, eval, bench, demo,
generate, chat, floor. Each command lives in its own module with a `main(argv)`; every command takes `--device`.
An error is one `error:` line on stderr and a non-zero exit, never a traceback (`python -X dev -m
dsv4_vk ...` shows the traceback)."""
from __future__ import annotations

import argparse
import importlib
import os
import sys

COMMANDS = {
    "info": ("dsv4_vk.cli.info", "device report: capabilities and which HC kernels run here"),
    "eval": ("dsv4_vk.cli.eval", "correctness sweep: fused vs unfused vs float64 reference"),
    "bench": ("dsv4_vk.cli.bench", "speed of every case and path against the device floor"),
    "demo": ("dsv4_vk.cli.demo", "generate tokens with a small random model, fused vs unfused HC"),
    "generate": ("dsv4_vk.cli.generate", "text in, text out with a Hugging Face DeepSeek-V4 model directory"),
    "chat": ("dsv4_vk.cli.chat", "a conversation on stdin that reuses the decode cache turn after turn"),
    "floor": ("dsv4_vk.cli.floor", "the device baseline: dispatch latency, barrier cost, copy bandwidth"),
}


def program() -> str:
    """How the user invoked us, for usage lines: `dsv4_vk` (console script) or `python -m dsv4_vk`."""
    base = os.path.basename(sys.argv[0] or "")
    return "python -m dsv4_vk" if base in ("__main__.py", "-m", "-c", "") else base


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):           # one line, as every other error (not the whole usage)
        self.exit(2, f"error: {message} (`{self.prog} --help` lists the options)\n")


def parser(command: str, description: str | None = None, **kw) -> argparse.ArgumentParser:
    """The argument parser of one command, with the `--device` option every command has."""
    ap = _Parser(prog=f"{program()} {command}", description=description, **kw)
    ap.add_argument("--device", metavar="INDEX|NAME",
                    help="Vulkan device by index (see `info --all`) or name substring; same as DSV4_VK_DEVICE")
    return ap


def check_sampling(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--temperature, --top-k and --seed (the commands that sample) checked: a one-line error naming the option."""
    from ..ops.sample import MAX_TOP_K
    if not 0 <= args.temperature < float("inf"):
        ap.error(f"--temperature must be a finite number ≥ 0, got {args.temperature}")
    if not 1 <= args.top_k <= MAX_TOP_K:
        ap.error(f"--top-k must be from 1 to {MAX_TOP_K}, got {args.top_k}")
    if not 0 <= args.seed < 2 ** 31:
        ap.error(f"--seed must be from 0 to 2^31 - 1, got {args.seed}")


def apply_device(args: argparse.Namespace) -> None:
    """Make --device the process's device choice (in place of DSV4_VK_DEVICE; errors name --device)."""
    if getattr(args, "device", None) is not None:
        if not args.device.strip():
            raise SystemExit("error: --device must be a device index or a name substring, got an empty string")
        from ..vk.device import choose_default
        choose_default(args.device, "--device")


def error_line(e: BaseException) -> str:
    """One line for an exception: the message (with the path for an OS error), the type where it says more."""
    if isinstance(e, OSError) and e.strerror:
        if e.filename is None:
            return e.strerror
        from ..vk.errors import path_problem
        return f"{e.filename}: {path_problem(e.filename, e)}"
    msg = " ".join(str(e).split()) or type(e).__name__
    return msg if isinstance(e, (ValueError, RuntimeError, LookupError)) else f"{type(e).__name__}: {msg}"


def _usage() -> str:
    lines = [f"usage: {program()} [--version] [--device INDEX|NAME] {{{','.join(COMMANDS)}}} [options]", ""]
    lines += [f"  {k:8s} {doc}" for k, (_, doc) in COMMANDS.items()]
    lines += ["", f"`{program()} <command> --help` lists a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # options before the command: --version, --device (kept for the command, which applies it)
    lead = []
    while argv and argv[0].startswith("-") and argv[0] not in ("-h", "--help"):
        opt = argv.pop(0)
        if opt == "--version":
            from .. import __version__
            print(f"dsv4_vk {__version__}")
            return 0
        if opt == "--device" and argv:
            lead += [opt, argv.pop(0)]
        elif opt.startswith("--device="):
            lead.append(opt)
        else:
            print(f"error: unknown option {opt!r} before the command\n\n{_usage()}", file=sys.stderr)
            return 2
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        if argv and argv[0] not in ("-h", "--help"):
            print(f"error: unknown command {argv[0]!r}\n", file=sys.stderr)
        print(_usage())
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    mod = importlib.import_module(COMMANDS[argv[0]][0])
    try:
        return mod.main(lead + argv[1:]) or 0
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if sys.flags.dev_mode:
            raise
        print(f"error: {error_line(e)}", file=sys.stderr)
        return 1
