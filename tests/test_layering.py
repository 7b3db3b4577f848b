"""The package's import tiers (docs/architecture.md), read from the source with `ast`:
a module imports only modules of its own tier or below, no import circle exists, the
cluster package imports no TensorFlow (not even through the modules it imports), and an
import inside a function says why in a comment (the three reasons: keep TensorFlow out
of a process, create the strategy before Keras, an optional heavy dependency)."""

import ast
import os
import sys

import pytest

from conftest import REPO

PACKAGE = os.path.join(REPO, "tf_gan_scale")

# Lowest first. A module's tier is that of the longest prefix listed.
TIERS = [
    ["tf_gan_scale.errors", "tf_gan_scale.cli", "tf_gan_scale.cluster"],
    ["tf_gan_scale.replica", "tf_gan_scale.latents", "tf_gan_scale.precision",
     "tf_gan_scale.images", "tf_gan_scale.schedules", "tf_gan_scale.perf",
     "tf_gan_scale.keras_files"],
    # configs: the default config, of data's tier (it names the default source); the
    # run record compares a config with its defaults (training/record.py).
    ["tf_gan_scale.layers", "tf_gan_scale.architectures", "tf_gan_scale.data",
     "tf_gan_scale.metrics", "tf_gan_scale.configs"],
    ["tf_gan_scale.gan"],
    ["tf_gan_scale.distribute", "tf_gan_scale.parallel"],
    ["tf_gan_scale.training"],
    ["tf_gan_scale.artifacts", "tf_gan_scale.interop"],
    ["tf_gan_scale.main", "tf_gan_scale"],
]
# Imports of these inside a function need a comment saying why.
HEAVY = ("tf_gan_scale", "tensorflow", "keras", "tensorflow_datasets", "matplotlib",
         "sklearn", "PIL", "scipy")


def modules():
    """{module name: path} of every module of the package."""
    out = {}
    for root, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py"):
                path = os.path.join(root, f)
                name = os.path.relpath(path, REPO)[:-3].replace(os.sep, ".")
                out[name.removesuffix(".__init__")] = path
    return out


MODULES = modules()


def tier(module):
    best = max((p for t in TIERS for p in t if module == p or module.startswith(p + ".")),
               key=len)
    return next(i for i, t in enumerate(TIERS) if best in t)


def imports(path):
    """[(imported module, line, at top level)] of the package's and the heavy imports in
    `path` (`from X import Y` counts Y when X.Y is a module)."""
    src = open(path).read()
    tree = ast.parse(src)
    top_level = {id(n) for n in tree.body} | {
        id(c) for n in tree.body if isinstance(n, (ast.If, ast.Try))
        for c in ast.walk(n) if isinstance(c, (ast.Import, ast.ImportFrom))}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES
                     else node.module for a in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in HEAVY:
                out.append((name, node.lineno, id(node) in top_level))
    return out


def package_imports(path):
    return {name for name, _, _ in imports(path) if name.split(".")[0] == "tf_gan_scale"
            and name in MODULES}


def test_every_module_has_a_tier():
    for name in MODULES:
        tier(name)  # StopIteration / ValueError if not.


def test_no_module_imports_a_higher_tier():
    bad = [f"{name} (tier {tier(name)}) imports {other} (tier {tier(other)})"
           for name, path in MODULES.items() for other in package_imports(path)
           if tier(other) > tier(name)]
    assert not bad, "\n".join(bad)


def test_no_import_circles():
    graph = {name: package_imports(path) - {name} for name, path in MODULES.items()}
    # A package's __init__ importing its own modules is how packages re-export; what
    # would make a circle is a module importing back up into its package's __init__.
    graph = {n: {m for m in deps if not (n.startswith(m + "."))} for n, deps in graph.items()}
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                raise AssertionError("import circle: " + " -> ".join(
                    stack[stack.index(nxt):] + [nxt]))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name)


def test_the_cluster_package_imports_no_tensorflow_even_indirectly():
    seen, todo = set(), [n for n in MODULES if n.startswith("tf_gan_scale.cluster")]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        heavy = [n for n, _, _ in imports(MODULES[name]) if n.split(".")[0] in
                 ("tensorflow", "keras")]
        assert not heavy, f"{name} imports {heavy}"
        todo += package_imports(MODULES[name])


def test_an_import_inside_a_function_says_why():
    bad = []
    for name, path in MODULES.items():
        lines = open(path).read().splitlines()
        for imported, line, top in imports(path):
            if top:
                continue
            here, first = lines[line - 1], line - 1
            while lines[first - 1].strip().startswith(("import ", "from ")):
                first -= 1  # A block of imports shares the comment above it.
            if "#" not in here and not lines[first - 1].strip().startswith("#"):
                bad.append(f"{name}:{line}: {here.strip()}")
    assert not bad, "in-function imports without a comment saying why:\n" + "\n".join(bad)


@pytest.mark.parametrize("module", ["tf_gan_scale.cluster.launch", "tf_gan_scale.cluster.env",
                                    "tf_gan_scale.cluster.kubernetes"])
def test_importing_the_cluster_package_loads_no_tensorflow(module):
    """The real import, in a fresh interpreter (no TensorFlow, ~0.1 s)."""
    import subprocess
    code = f"import sys, {module}; print('tensorflow' in sys.modules, 'keras' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, env=dict(os.environ, TF_GAN_SCALE_COLD_START="1"))
    assert out.stdout.split() == ["False", "False"], out.stderr[-2000:]


def test_test_files_have_unique_basenames():
    """The test folders are not packages (rootdir-relative imports): two test files of
    one basename make pytest's collection of the whole suite fail ("import file
    mismatch"), which a run of either folder alone does not show."""
    seen = {}
    for folder, _, files in os.walk(os.path.join(REPO, "tests")):
        for f in files:
            if f.startswith("test_") and f.endswith(".py"):
                seen.setdefault(f, []).append(os.path.relpath(os.path.join(folder, f), REPO))
    assert not {f: p for f, p in seen.items() if len(p) > 1}
