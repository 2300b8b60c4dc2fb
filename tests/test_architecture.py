"""The package's imports against docs/design.md's map: no circle, nothing that
looks up a layer, and a map that names every module there is."""
import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "dlio_ckpt_ext"
DESIGN = REPO / "docs" / "design.md"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def design_map() -> tuple[list[str], dict[str, str]]:
    text = DESIGN.read_text()
    order = re.search(r"^Layers, bottom first: (.+)\.$", text, re.M)
    assert order, "docs/design.md lost its 'Layers, bottom first:' line"
    layers = re.findall(r"`(\w+)`", order.group(1))
    rows = re.findall(r"^\| `(dlio_ckpt_ext/[\w/]+\.py)` \| (\w+) \|", text, re.M)
    return layers, {module_name(REPO / path): layer for path, layer in rows}


def imports_in(source: str, name: str, modules: set[str]) -> set[str]:
    """Every package module the source of module `name` imports, wherever the
    statement sits (inside functions and `if TYPE_CHECKING:` too: edges all the same)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                found.add(sub if sub in modules else node.module)
    return {m for m in found if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    paths = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {m: imports_in(p.read_text(), m, set(paths)) for m, p in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_map_names_every_module_and_only_those():
    layers, mapped = design_map()
    real = set(import_graph())
    assert sorted(real - set(mapped)) == [], "modules missing from docs/design.md's map"
    assert sorted(set(mapped) - real) == [], "docs/design.md maps modules that are gone"
    assert sorted({layer for layer in mapped.values()} - set(layers)) == []


def test_no_import_circle():
    assert circles(import_graph()) == []


def test_no_import_looks_up_a_layer():
    layers, mapped = design_map()
    rank = {name: i for i, name in enumerate(layers)}
    upward = sorted(f"{m} ({mapped[m]}) -> {t} ({mapped[t]})" for m, targets in import_graph().items()
                    for t in targets if rank[mapped[t]] > rank[mapped[m]])
    assert upward == []


def test_the_walker_sees_a_circle_and_imports_anywhere_in_a_module():
    """The checks above, on a graph and a source that break them, so that they can fail."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set()}) == [["a", "b", "c"]]
    source = ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import dlio_ckpt_ext.storage\n"
              "def f():\n    from dlio_ckpt_ext.dlio.session import CheckpointSession\n")
    modules = set(import_graph())
    assert imports_in(source, "dlio_ckpt_ext.engine.threads", modules) == {"dlio_ckpt_ext.storage",
                                                                          "dlio_ckpt_ext.dlio.session"}


#: each folder of the package and the layer(s) its modules belong to
FOLDER_LAYERS = {"": {"base", "config"}, "layouts": {"config"}, "shared_plans": {"config"}, "recovery": {"config"}, "engine": {"engine"}, "storage": {"storage"}, "checkpoint": {"checkpoint"},
                 "dlio": {"dlio"}, "results": {"dlio"}, "report": {"tools"}, "submission": {"tools"}, "tools": {"tools"}}


def folder_of(module: str) -> str:
    parts = module.split(".")[1:]
    path = PACKAGE.joinpath(*parts)
    return "" if len(parts) == 0 or (len(parts) == 1 and not path.is_dir()) else parts[0]


def test_each_folder_holds_one_layer():
    """A newcomer opening the package sees the layers as folders."""
    _, mapped = design_map()
    misplaced = sorted(f"{m} ({layer}) in {folder_of(m) or 'the top level'}" for m, layer in mapped.items()
                       if layer not in FOLDER_LAYERS.get(folder_of(m), set()))
    assert misplaced == []
    assert set(FOLDER_LAYERS) - {""} == {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}


#: a layout's name compared, or a layout named among values tested against
_LAYOUT_COMPARED = re.compile(r"""(layout\w*\s*(==|!=|\bin\b|\bnot in\b))|((==|!=)\s*["'](%s)["'])"""
                              % "|".join(("deepspeed", "dcp", "safetensors", "megatron", "orbax")))


def test_nothing_outside_the_layouts_compares_a_layouts_name():
    """A new layout is one module (dlio_ckpt_ext/layouts/): the rest of the package asks
    the layout object the registry returns, never which layout it is."""
    found = [f"{p.relative_to(REPO)}:{i}: {line.strip()}" for p in sorted(PACKAGE.rglob("*.py"))
             if "layouts" not in p.relative_to(PACKAGE).parts
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if _LAYOUT_COMPARED.search(line.split("#", 1)[0])]
    assert found == []
    assert _LAYOUT_COMPARED.search('if cfg.checkpoint.layout == "dcp":')  # the check can fail
    assert _LAYOUT_COMPARED.search('if p.layout not in COMMITTED:') and _LAYOUT_COMPARED.search('x != "orbax"')
