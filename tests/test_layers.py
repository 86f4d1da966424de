"""The package's floors, checked statically (ast, nothing imported): vk → core → ops → hc → model → cli.
A module imports only from its own floor or a lower one, and no set of modules imports each other in
a circle (imports inside functions included: a lazy import is still a dependency; imports under
`if TYPE_CHECKING:` are not, since they never run)."""
import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "dsv4_vk"
FLOORS = ("vk", "core", "ops", "hc", "model", "cli")


def _module(path: Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """The dsv4_vk modules `path` imports (a name imported from a package counts as its submodule
    where one exists)."""
    mod = _module(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out = set()
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):        # type-only imports (under `if TYPE_CHECKING:`) never run
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("dsv4_vk"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith("dsv4_vk"):
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if _path_of(sub) else target)
    return out - {mod}


def _path_of(mod: str) -> Path | None:
    p = PKG.parent.joinpath(*mod.split("."))
    for cand in (p.with_suffix(".py"), p / "__init__.py"):
        if cand.exists():
            return cand
    return None


def _floor(mod: str) -> int | None:
    parts = mod.split(".")
    return FLOORS.index(parts[1]) if len(parts) > 1 and parts[1] in FLOORS else None


GRAPH = {_module(p): _imports(p) for p in sorted(PKG.rglob("*.py"))}


def test_the_import_graph_is_read():
    assert "dsv4_vk.hc.composite" in GRAPH and "dsv4_vk.core.graph" in GRAPH["dsv4_vk.hc.composite"]
    assert "dsv4_vk.vk" in {m.rpartition(".")[0] for m in GRAPH["dsv4_vk.core.executor"]} | GRAPH["dsv4_vk.core.executor"]


def test_no_module_imports_from_a_higher_floor():
    upward = [f"{mod} ({FLOORS[_floor(mod)]}) imports {dep} ({FLOORS[_floor(dep)]})"
              for mod, deps in GRAPH.items() if _floor(mod) is not None
              for dep in deps if _floor(dep) is not None and _floor(dep) > _floor(mod)]
    assert not upward, "\n".join(upward)


def _cycle():
    """One import circle among the package's modules (a list of modules, first = last), or None.
    A package's __init__ importing its own submodules (re-exports) is not followed into the package:
    `from . import x` inside a submodule is a dependency on x, not on the package."""
    edges = {m: {d for d in deps if d in GRAPH and not m.startswith(d + ".")} for m, deps in GRAPH.items()}
    state, stack = {}, []

    def visit(m):
        state[m] = 1
        stack.append(m)
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                return stack[stack.index(d):] + [d]
            if d not in state and (found := visit(d)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_no_import_circle():
    cycle = _cycle()
    assert cycle is None, " → ".join(cycle)


def test_a_circle_is_found_where_there_is_one():
    GRAPH["dsv4_vk.ops.base"].add("dsv4_vk.ops.mul_mat")       # mul_mat imports base: a circle
    try:
        assert _cycle() is not None
    finally:
        GRAPH["dsv4_vk.ops.base"].discard("dsv4_vk.ops.mul_mat")
