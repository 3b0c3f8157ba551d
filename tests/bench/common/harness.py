"""What the benchmark scripts share: loading the pipeline harness and reading the machine's load.

Each script (tests/bench/<name>/<name>.py, or its copy build/tests/bench/<name>/<name>) puts this folder on
sys.path and imports this module; meson copies it beside the scripts' copies, to build/tests/bench/common.
"""
import importlib.machinery, importlib.util, os

HERE = os.path.dirname(os.path.abspath(__file__))


def load_harness():
    """pipeline.py (source tree) or its copy `pipeline` (build tree): the stack, psql and /proc helpers."""
    for name in ("pipeline.py", "pipeline"):
        path = os.path.join(HERE, "..", "pipeline", name)
        if os.path.exists(path):
            loader = importlib.machinery.SourceFileLoader("cg_pipeline_bench", path)
            spec = importlib.util.spec_from_loader(loader.name, loader)
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
            return mod
    raise RuntimeError("tests/bench/pipeline/pipeline.py not found")


def load():
    """The load average over 1, 5 and 15 minutes, as /proc/loadavg gives it."""
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])
