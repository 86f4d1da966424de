"""`python -m dsv4_vk <command>`: info, eval, bench, demo. Each command lives in its own module."""
import importlib
import sys

COMMANDS = {
    "info": ("dsv4_vk.info", "device report: capabilities and which HC kernels run here"),
    "eval": ("dsv4_vk.evaluate", "correctness sweep: fused vs unfused vs float64 reference"),
    "bench": ("dsv4_vk.bench", "speed of every case and path against the device floor"),
    "demo": ("dsv4_vk.demo", "generate tokens with a small random model, fused vs unfused HC"),
}


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help") or argv[0] not in COMMANDS:
        print("usage: python -m dsv4_vk {" + ",".join(COMMANDS) + "} [options]\n")
        for k, (_, doc) in COMMANDS.items():
            print(f"  {k:6s} {doc}")
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    mod = importlib.import_module(COMMANDS[argv[0]][0])
    return mod.main(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
